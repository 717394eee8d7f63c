package etcdv3

import (
	"testing"
	"time"
)

// The periodic re-list of every lease by every host must cost etcd reads
// that grow as N, not N²: the interval stretches with the lease set.
func TestResyncIntervalGrowsWithLeaseSet(t *testing.T) {
	for _, n := range []int{0, 100, 3000, 10000, 50000} {
		got := resyncInterval(5*time.Minute, n)
		if got < 5*time.Minute {
			t.Errorf("%d leases: interval %s, shorter than the configured 5m", n, got)
		}
		// N hosts each reading n=N leases per interval: per second that is
		// N*N/interval reads; at most 10 per host, whatever N.
		perHost := float64(n) / got.Seconds()
		if perHost > 10.001 {
			t.Errorf("%d leases: every host reads %.1f leases a second from etcd (interval %s); want at most 10, so that etcd's load grows as N", n, perHost, got)
		}
	}
	if got := resyncInterval(5*time.Minute, 100); got != 5*time.Minute {
		t.Errorf("100 leases: interval %s, want the configured 5m", got)
	}
}
