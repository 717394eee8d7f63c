package etcdv3

import (
	"context"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// startSource runs the steps of subnet.Source up to the claim, as the
// daemon does, for host h against f's etcd, keeping its journal at path.
func startSource(t *testing.T, f *fixture, h Host, path string) *Source {
	t.Helper()
	s := NewSource(SourceConfig{Endpoints: []string{f.srv.Endpoint}, JournalFile: path,
		Dial: func(context.Context) (*clientv3.Client, error) {
			return clientv3.New(clientv3.Config{Endpoints: []string{f.srv.Endpoint}})
		}})
	t.Cleanup(s.Close)
	if err := s.Connect(ctx(t)); err != nil {
		t.Fatal(err)
	}
	cfg, err := s.Config(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Claim(ctx(t), cfg, h.subnetHost(cfg), nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// The etcd source keeps the lease journal itself: a run's watch saves the
// lease set, and the next run's Acquire resumes from it — also when its
// first attempt failed (a start-up step is retried) — and its watch says
// which batch makes the set current again (Behind, then CaughtUp), with
// what changed meanwhile delivered by then.
func TestSourceResumesFromItsJournalAcrossARetriedAcquire(t *testing.T) {
	f := newFixture(t, testNetwork)
	path := filepath.Join(t.TempDir(), "subnet.env.leases")

	first := startSource(t, f, host(1), path)
	lease, snap, err := first.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Saved || snap.Behind != "" {
		t.Fatalf("a first start's lease set: saved %v, behind %q; want a listing, current", snap.Saved, snap.Behind)
	}
	// The watch saves what it delivers: run it until its own new lease
	// has come in (before that the journal names no lease of this host).
	wctx, stop := context.WithCancel(ctx(t))
	for b := range first.Watch(wctx, snap, subnet.WatchOptions{}) {
		for _, ev := range b.Events {
			if ev.Lease.Subnet == lease.Subnet {
				stop() // the loop goes on until the watch (and its journal) ended
			}
		}
	}
	first.Close()

	// While host 1 is down, host 2 joins.
	joined, _, err := f.manager(host(2), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}

	again := startSource(t, f, host(1), path)
	gone, cancel := context.WithCancel(ctx(t))
	cancel()
	if _, _, err := again.Acquire(gone); err == nil {
		t.Fatal("Acquire with an ended context succeeded")
	}
	l, snap, err := again.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Saved || l.Subnet != lease.Subnet {
		t.Fatalf("the retried Acquire: lease %s, saved %v; want %s resumed from the journal", l.Subnet, snap.Saved, lease.Subnet)
	}
	if snap.Behind == "" {
		t.Fatal("a saved set etcd has moved on from is not behind")
	}
	added := false
	wctx, stop = context.WithCancel(ctx(t))
	defer stop()
	for b := range again.Watch(wctx, snap, subnet.WatchOptions{}) {
		for _, ev := range b.Events {
			added = added || ev.Type == subnet.Added && ev.Lease.Subnet == joined.Subnet
		}
		if b.CaughtUp {
			stop() // the loop goes on until the watch has ended
		}
	}
	if !added {
		t.Errorf("caught up without the lease %s that joined meanwhile", joined.Subnet)
	}
}
