package etcdv3

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A progress answer that arrives as the stall timer fires is waiting in the
// watch channel when the select happens to pick the timer: not a stall.
func TestStallCheckHeedsAnAnswerWaitingBesideTheTimer(t *testing.T) {
	wch := make(chan clientv3.WatchResponse, 1)
	s := newStallCheck(nil, t.Context(), wch, nil, func() int64 { return 0 }, time.Hour, time.Hour)
	defer s.stop()
	s.asked = time.Now().Add(-2 * time.Hour) // a progress request went unanswered past the timeout...
	wch <- clientv3.WatchResponse{}          // ...but its answer is here
	if reason := s.check(); reason != "" {
		t.Fatalf("check() = %q with an answer waiting, want no stall", reason)
	}
	<-wch
	s.heard()
	s.asked = time.Now().Add(-2 * time.Hour)
	if reason := s.check(); reason == "" {
		t.Fatal("check() found no stall with nothing waiting and the request overdue")
	}
}
