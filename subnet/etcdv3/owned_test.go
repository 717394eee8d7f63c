package etcdv3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// A lease naming this host outside the network config is never left behind
// for a second one: Acquire refuses, naming it and the fix.
func TestAcquireRefusesWithAStrandedLease(t *testing.T) {
	f := newFixture(t, testNetwork)
	// Pinned: at random it was now and then the reservation made below.
	h1 := host(1)
	h1.Previous = subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	old, _, err := f.manager(h1, ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	moved, err := f.reg.PutConfig(ctx(t), []byte(`{"Network":"10.50.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = NewManager(f.reg, moved, host(1), ManagerOptions{}).Acquire(ctx(t))
	if !errors.Is(err, ErrStranded) || !strings.Contains(err.Error(), old.Subnet.String()) || !strings.Contains(err.Error(), "overlayd teardown") {
		t.Fatalf("Acquire with a stranded lease = %v, want ErrStranded naming %s and the fix", err, old.Subnet)
	}
	// operations.md quotes the error as `overlayd run` prints it, for the
	// lease 10.244.7.0/24 of node worker-7.
	doc, derr := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "operations.md"))
	if derr != nil {
		t.Fatal(derr)
	}
	const quoted = "Error: acquire a lease: this host's lease is outside the network config: "
	_, line, _ := strings.Cut(string(doc), quoted)
	line, _, _ = strings.Cut(line, "\n")
	line = strings.NewReplacer("10.244.7.0/24", old.Subnet.String(), "10.244.7.0-24", subnet.Key(old.Subnet), `"worker-7"`, `"node-1"`).Replace(line)
	if want := ErrStranded.Error() + ": " + line; err.Error() != want {
		t.Errorf("operations.md quotes the stranded-lease error as\n%s\nit is\n%s", want, err)
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Leases) != 1 {
		t.Fatalf("leases = %+v (%v), want only the stranded one", snap.Leases, err)
	}
	// Another host is not concerned.
	if _, _, err := NewManager(f.reg, moved, host(2), ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatalf("another host: %v", err)
	}
	// A stranded reservation: the fix is to move the reservation.
	if _, err := f.reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.9.0/24")}, subnet.LeaseAttrs{PublicIP: host(3).PublicIP.String(), BackendType: "vxlan"}, 0); err != nil {
		t.Fatal(err)
	}
	_, _, err = NewManager(f.reg, moved, host(3), ManagerOptions{}).Acquire(ctx(t))
	if !errors.Is(err, ErrStranded) || !strings.Contains(err.Error(), "overlayd lease revoke 10.244.9.0/24") {
		t.Fatalf("Acquire with a stranded reservation = %v", err)
	}
}

// The liveness key is the manager's: deleted, it is written again, and
// readiness's view (Liveness) says why it was missing meanwhile.
func TestLivenessKeyIsRecreatedAfterDeletion(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	if _, _, err := m.Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if alive, err := m.Liveness(); alive || err != nil {
		t.Errorf("before Run: Liveness = %v, %v; want not yet written, no error", alive, err)
	}
	startRun(t, m)
	key := f.reg.Keys.NodeKey("node-1")
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

// Two clones (one node ID, two machines) claiming at once: exactly one wins,
// and its claim is kept alive before it ever runs; the other waits out the
// winner's TTL and fails. A check that only read the key let both through.
func TestClonesClaimingAtOnceGetOneWinner(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	clone := host(1)
	clone.PublicIP = netip.MustParseAddr("198.18.0.200")
	opts := ManagerOptions{LivenessTTL: 2 * time.Second}
	ms := []*Manager{f.manager(host(1), opts), f.manager(clone, opts)}
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = m.ClaimNodeID(ctx(t)) })
	}
	wg.Wait()
	if winners(t, errs, ErrDuplicateNode) != 1 {
		t.Fatalf("claims: %v; want exactly one to succeed", errs)
	}
}

// A start-up that gives up after its claim (ReleaseClaim) frees the node
// ID at once: the key is gone and a host taking the name over (a moved
// --node-name) claims it without waiting out the TTL. Once Run holds the
// claim, ReleaseClaim leaves it alone.
func TestReleasedClaimFreesTheNodeIDAtOnce(t *testing.T) {
	f := newFixture(t, testNetwork)
	long := ManagerOptions{LivenessTTL: time.Minute}
	first := f.manager(host(1), long)
	if err := first.ClaimNodeID(ctx(t)); err != nil {
		t.Fatal(err)
	}
	first.ReleaseClaim(ctx(t))
	key := f.reg.Keys.NodeKey("node-1")
	if resp, err := f.cli.Get(ctx(t), key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("after ReleaseClaim: %v, %v; want the liveness key gone", resp.Kvs, err)
	}
	other := host(1)
	other.PublicIP = netip.MustParseAddr("198.18.0.200")
	m := f.manager(other, long)
	// Within a bound far below the minute the first claim would hold it.
	c, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	defer cancel()
	if err := m.ClaimNodeID(c); err != nil {
		t.Fatalf("claim after the release: %v; want it at once", err)
	}
	if _, _, err := m.Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	startRun(t, m)
	testenv.WaitFor(t, testenv.Slack, "the liveness key held", m.Alive)
	m.ReleaseClaim(ctx(t)) // Run's now: nothing to release
	if resp, err := f.cli.Get(ctx(t), key); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("ReleaseClaim while Run holds the claim: key %v, %v; want it kept", resp.Kvs, err)
	}
	if alive, err := m.Liveness(); !alive {
		t.Fatalf("ReleaseClaim while Run holds the claim: liveness %v", err)
	}
}

// Run keeps the key ClaimNodeID wrote (the same etcd lease), and never
// takes it from another host: overwritten, it is lost, and it is written
// again only once the other host's key is gone.
func TestLivenessKeyIsNeverTakenFromAnotherHost(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	if err := m.ClaimNodeID(ctx(t)); err != nil {
		t.Fatal(err)
	}
	key := f.reg.Keys.NodeKey("node-1")
	holder := func() (ip string, lease int64) {
		resp, err := f.cli.Get(ctx(t), key)
		if err != nil || len(resp.Kvs) != 1 {
			return "", 0
		}
		var v livenessValue
		_ = json.Unmarshal(resp.Kvs[0].Value, &v)
		return v.PublicIP, resp.Kvs[0].Lease
	}
	ip, claimed := holder()
	if ip != host(1).PublicIP.String() {
		t.Fatalf("after ClaimNodeID the key names %q, want %s", ip, host(1).PublicIP)
	}
	if _, _, err := m.Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	startRun(t, m)
	testenv.WaitFor(t, testenv.Slack, "the liveness key held", m.Alive)
	if _, lease := holder(); lease != claimed {
		t.Errorf("Run holds the key on etcd lease %x, want the claim's %x", lease, claimed)
	}

	grant, err := f.cli.Grant(ctx(t), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx(t), key, `{"PublicIP":"198.18.0.200","Hostname":"clone"}`, clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "the overwrite seen as a loss", func() bool {
		alive, err := m.Liveness()
		return !alive && err != nil && strings.Contains(err.Error(), "held by another overlayd at 198.18.0.200 (clone)")
	})
	if ip, _ := holder(); ip != "198.18.0.200" {
		t.Fatalf("the other host's key was overwritten: it names %q", ip)
	}
	if _, err := f.cli.Revoke(ctx(t), grant.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "the key written again once the other is gone", func() bool {
		ip, _ := holder()
		return ip == host(1).PublicIP.String() && m.Alive()
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
	next := func() subnet.ConfigUpdate {
		t.Helper()
		select {
		case u := <-ch:
			return u
		case <-time.After(testenv.Deadline(testenv.Slack)):
			t.Fatal("no config update")
		}
		return subnet.ConfigUpdate{}
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
	if _, err := f.cli.Put(ctx(t), f.reg.Keys.ConfigKey(), `{"Network":"bogus"}`); err != nil {
		t.Fatal(err)
	}
	if u := next(); !errors.Is(u.Err, subnet.ErrInvalidConfig) {
		t.Fatalf("after an invalid put = %+v", u)
	}
	if _, err := f.cli.Delete(ctx(t), f.reg.Keys.ConfigKey()); err != nil {
		t.Fatal(err)
	}
	if u := next(); !errors.Is(u.Err, ErrNoConfig) {
		t.Fatalf("after a delete = %+v", u)
	}
}

// During an etcd outage the watcher's retries do not repeat their warning
// every few seconds: one line when the outage begins, then at most one per
// WarnEvery (before, each failed re-list logged its own line).
func TestWatchOutageWarnsOncePerWarnEvery(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	opts := WatchOptions{ProgressInterval: 100 * time.Millisecond, StallTimeout: 100 * time.Millisecond,
		RequestTimeout: 200 * time.Millisecond, RetryInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	restarts := make(chan string, 100)
	opts.OnRestart = func(r string) { restarts <- r }
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batches := f.reg.Watch(wctx, snap, opts)
	go func() {
		for range batches {
		}
	}()
	f.srv.Close()
	<-restarts // the outage is noticed
	// Long enough for a dozen failed re-lists at these intervals.
	time.Sleep(3 * time.Second)
	if n := strings.Count(logs.String(), "level=WARN"); n > 2 {
		t.Fatalf("%d warnings within 3 s of an outage, want at most 2 (restart, first failed re-list):\n%s", n, logs.String())
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The liveness value is anyone's to write: messages name its holder as
// written only when it is an address and a plain host name.
func TestLivenessHolderIsNamedSafely(t *testing.T) {
	for _, tt := range []struct {
		v    livenessValue
		want string
	}{
		{livenessValue{PublicIP: "198.18.0.1", Hostname: "h1.example-net_2"}, `198.18.0.1 (h1.example-net_2)`},
		{livenessValue{PublicIP: "fd00::1", Hostname: "h1"}, `fd00::1 (h1)`},
		{livenessValue{PublicIP: "198.18.0.1\n\x1b[2J", Hostname: "a b\r"}, `"198.18.0.1\n\x1b[2J" ("a b\r")`},
		{livenessValue{}, `"" ("")`},
	} {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("%+v: %s, want %s", tt.v, got, tt.want)
		}
	}
}
