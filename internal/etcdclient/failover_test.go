package etcdclient

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/lab"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// A member whose connections go silent without closing (its host vanished,
// a firewall drops its packets) must not hold a watch or requests hostage:
// gRPC keepalive drops the dead connection within KeepAliveTime +
// KeepAliveTimeout and the client carries on with the other members. The
// watch resumes there from its last revision, so no event is lost. Without
// keepalive neither would ever happen: the kernel still acknowledges the
// proxy's socket, so TCP sees nothing wrong.
func TestClientFailsOverFromABlackholedMember(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartCluster(t, 3)
	direct := cluster.Client(t)
	cluster.WaitHealthy(t, direct)
	dir, err := os.MkdirTemp("/tmp", "ovl-ka-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var proxied []string
	var proxies []*lab.Proxy
	for i, ep := range cluster.Endpoints() {
		p, err := lab.NewProxy(filepath.Join(dir, fmt.Sprintf("m%d.sock", i)), ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		proxies = append(proxies, p)
		proxied = append(proxied, p.Endpoint())
	}
	// The client starts with member 0 only, so its watch surely lives on
	// that connection, then learns the others.
	cli, err := New(Config{Endpoints: proxied[:1]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(90*time.Second))
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), "ka/", clientv3.WithPrefix())
	if _, err := direct.Put(ctx, "ka/0", "before"); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, wch, testenv.Slack); ev != "ka/0" {
		t.Fatalf("first event for %s", ev)
	}
	cli.SetEndpoints(proxied...)

	proxies[0].Set(lab.ProxyBlackhole)
	cut := time.Now()
	if _, err := direct.Put(ctx, "ka/1", "during"); err != nil {
		t.Fatal(err)
	}
	bound := DefaultKeepAliveTime + DefaultKeepAliveTimeout + testenv.Slack
	if ev := nextEvent(t, wch, bound); ev != "ka/1" {
		t.Fatalf("event after the failover for %s, want ka/1", ev)
	}
	watchBack := time.Since(cut)
	// Requests work again on every try: the dead connection is gone and the
	// member is not picked while it does not answer.
	deadline := time.Now().Add(testenv.Deadline(bound))
	for ok := 0; ok < 10; {
		// A request sent to the blackholed member never answers; one to a
		// live member answers in milliseconds, or seconds on a busy machine.
		rctx, rcancel := context.WithTimeout(ctx, testenv.Deadline(5*time.Second))
		_, err := cli.Put(rctx, "ka/probe", "x")
		rcancel()
		if err != nil {
			ok = 0
			if time.Now().After(deadline) {
				t.Fatalf("requests still fail %s after blackholing member 0: %v", time.Since(cut), err)
			}
			continue
		}
		ok++
	}
	t.Logf("member 0 blackholed: watch resumed on another member after %s, requests all succeed after %s (keepalive %s + %s)",
		watchBack.Round(100*time.Millisecond), time.Since(cut).Round(100*time.Millisecond), DefaultKeepAliveTime, DefaultKeepAliveTimeout)
}

func nextEvent(t *testing.T, wch clientv3.WatchChan, timeout time.Duration) string {
	t.Helper()
	timeout = testenv.Deadline(timeout)
	select {
	case resp, ok := <-wch:
		if !ok || resp.Err() != nil {
			t.Fatalf("watch ended: %v", resp.Err())
		}
		for _, ev := range resp.Events {
			return string(ev.Kv.Key)
		}
		return nextEvent(t, wch, timeout)
	case <-time.After(timeout):
		t.Fatalf("no watch event within %s", timeout)
	}
	return ""
}
