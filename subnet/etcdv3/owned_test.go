package etcdv3

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// A lease naming this host outside the network config is never left behind
// for a second one: Acquire refuses, naming it and the fix.
func TestAcquireRefusesWithAStrandedLease(t *testing.T) {
	f := newFixture(t, testNetwork)
	old, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	moved, err := f.reg.PutConfig(ctx(t), []byte(`{"Network":"10.50.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewManager(f.reg, moved, host(1), ManagerOptions{}).Acquire(ctx(t))
	if !errors.Is(err, ErrStranded) || !strings.Contains(err.Error(), old.Subnet.String()) || !strings.Contains(err.Error(), "overlayd teardown") {
		t.Fatalf("Acquire with a stranded lease = %v, want ErrStranded naming %s and the fix", err, old.Subnet)
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Leases) != 1 {
		t.Fatalf("leases = %+v (%v), want only the stranded one", snap.Leases, err)
	}
	// Another host is not concerned.
	if _, err := NewManager(f.reg, moved, host(2), ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatalf("another host: %v", err)
	}
	// A stranded reservation: the fix is to move the reservation.
	if _, err := f.reg.Create(ctx(t), netip.MustParsePrefix("10.244.9.0/24"), subnet.LeaseAttrs{PublicIP: host(3).PublicIP.String(), BackendType: "vxlan"}, 0); err != nil {
		t.Fatal(err)
	}
	_, err = NewManager(f.reg, moved, host(3), ManagerOptions{}).Acquire(ctx(t))
	if !errors.Is(err, ErrStranded) || !strings.Contains(err.Error(), "overlayd lease revoke 10.244.9.0/24") {
		t.Fatalf("Acquire with a stranded reservation = %v", err)
	}
}

// The liveness key is the manager's: deleted, it is written again, and
// readiness's view (Liveness) says why it was missing meanwhile.
func TestLivenessKeyIsRecreatedAfterDeletion(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	if _, err := m.Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if alive, err := m.Liveness(); alive || err != nil {
		t.Errorf("before Run: Liveness = %v, %v; want not yet written, no error", alive, err)
	}
	startRun(t, m)
	key := f.reg.NodeKey("node-1")
	present := func() bool {
		resp, err := f.cli.Get(ctx(t), key)
		return err == nil && len(resp.Kvs) == 1
	}
	testenv.WaitFor(t, testenv.Slack, "the liveness key", func() bool { return present() && m.Alive() })
	for range 3 {
		if _, err := f.cli.Delete(ctx(t), key); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, testenv.Slack, "the liveness key re-created", func() bool { return present() && m.Alive() })
	}
}

// The lease key is the manager's too: while it is gone readiness says why,
// and it comes back.
func TestLeaseKeyProblemIsReportedUntilReclaimed(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, m)
	if _, err := f.cli.Delete(ctx(t), f.reg.LeaseKey(l.Subnet)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "the lease key re-claimed and the problem cleared", func() bool {
		got, err := f.reg.Get(ctx(t), l.Subnet)
		return err == nil && got.Attrs.NodeID == "node-1" && m.KeyProblem() == nil
	})
}

func TestRepeatWarnLogsAtMostEveryWarnEvery(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var w repeatWarn
	for range 100 {
		w.warn(log, "re-list of leases failed, will retry", "err", "down")
	}
	if n := strings.Count(buf.String(), "re-list of leases failed"); n != 1 {
		t.Fatalf("100 failures within %s logged %d times, want once", WarnEvery, n)
	}
	w.last = time.Now().Add(-WarnEvery - time.Second) // as if 31 s passed
	w.warn(log, "re-list of leases failed, will retry", "err", "down")
	if !strings.Contains(buf.String(), "failures=101") {
		t.Errorf("the repeat does not count the failures:\n%s", buf.String())
	}
	w.recovered(log, "lease keeping resumed")
	if !strings.Contains(buf.String(), `msg="lease keeping resumed" failures=101`) {
		t.Errorf("recovery not logged with the count:\n%s", buf.String())
	}
	w.warn(log, "again", "err", "down")
	if !strings.Contains(buf.String(), "msg=again") {
		t.Error("a new failure after recovery is not logged at once")
	}
}

// WatchConfig delivers the config now, then each change, deletion and
// invalid value.
func TestWatchConfigFollowsChanges(t *testing.T) {
	f := newFixture(t, testNetwork)
	ch := f.reg.WatchConfig(ctx(t), 50*time.Millisecond)
	next := func() ConfigUpdate {
		t.Helper()
		select {
		case u := <-ch:
			return u
		case <-time.After(testenv.Deadline(testenv.Slack)):
			t.Fatal("no config update")
		}
		return ConfigUpdate{}
	}
	if u := next(); u.Err != nil || u.Config.Network != netip.MustParsePrefix("10.244.0.0/16") {
		t.Fatalf("first update = %+v", u)
	}
	if _, err := f.reg.PutConfig(ctx(t), []byte(`{"Network":"10.50.0.0/16"}`)); err != nil {
		t.Fatal(err)
	}
	if u := next(); u.Err != nil || u.Config.Network != netip.MustParsePrefix("10.50.0.0/16") {
		t.Fatalf("after a put = %+v", u)
	}
	if _, err := f.cli.Put(ctx(t), f.reg.ConfigKey(), `{"Network":"bogus"}`); err != nil {
		t.Fatal(err)
	}
	if u := next(); !errors.Is(u.Err, subnet.ErrInvalidConfig) {
		t.Fatalf("after an invalid put = %+v", u)
	}
	if _, err := f.cli.Delete(ctx(t), f.reg.ConfigKey()); err != nil {
		t.Fatal(err)
	}
	if u := next(); !errors.Is(u.Err, ErrNoConfig) {
		t.Fatalf("after a delete = %+v", u)
	}
}
