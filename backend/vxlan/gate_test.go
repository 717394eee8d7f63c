package vxlan_test

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
)

// fakeGate is a backend.Gate in memory: the set it admits, the calls in
// order (interleaved with the kernel writes by a Fake's OnWrite hook) and
// an error to fail Admit with.
type fakeGate struct {
	mu       sync.Mutex
	admitted map[netip.Addr]bool
	events   []string
	failWith error
	// failSettle fails the next Settle, once.
	failSettle error
	resyncs    int
	moved      map[string]string // MAC -> public address, for peers not at 198.18.0.n
}

func newFakeGate() *fakeGate { return &fakeGate{admitted: map[netip.Addr]bool{}} }

func (g *fakeGate) Admit(peers []backend.Peer, resync bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failWith != nil {
		g.events = append(g.events, "admit failed")
		return g.failWith
	}
	if resync {
		g.resyncs++
	}
	for _, p := range peers {
		g.admitted[p.PublicIP] = true
	}
	g.events = append(g.events, "admit")
	return nil
}

// Settle removes what no peer of keep has: of gone, or of everything
// admitted after a full pass (gone nil), as the guard does.
func (g *fakeGate) Settle(keep, gone []backend.Peer) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.failSettle; err != nil {
		g.failSettle = nil
		g.events = append(g.events, "settle failed")
		return err
	}
	kept := map[netip.Addr]bool{}
	for _, p := range keep {
		kept[p.PublicIP] = true
	}
	candidates := map[netip.Addr]bool{}
	for _, p := range gone {
		candidates[p.PublicIP] = true
	}
	for a := range g.admitted {
		if !kept[a] && (gone == nil || candidates[a]) {
			delete(g.admitted, a)
		}
	}
	g.events = append(g.events, "settle")
	return nil
}

func (g *fakeGate) has(a string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admitted[netip.MustParseAddr(a)]
}

func (g *fakeGate) set() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for a := range g.admitted {
		out = append(out, a.String())
	}
	slices.Sort(out)
	return out
}

// gatedHost is a fake host whose backend drives g, with every FDB write
// recorded among g's events together with whether the peer's address was
// admitted at that moment.
func gatedHost(t *testing.T) (*vxlantest.Fake, *vxlan.Backend, *fakeGate) {
	f, cfg := fakeHost(t)
	g := newFakeGate()
	cfg.Gate = g
	b := newBackend(t, cfg, f)
	f.OnWrite(func(op, key string) {
		if op != "FDBSet" && op != "FDBDel" {
			return
		}
		// key is the MAC 0e:00:00:00:00:0n of peer n at 198.18.0.n.
		ip := "198.18.0." + macHost(key)
		g.mu.Lock()
		if moved, ok := g.moved[key]; ok {
			ip = moved
		}
		g.mu.Unlock()
		state := "unadmitted"
		if g.has(ip) {
			state = "admitted"
		}
		g.mu.Lock()
		g.events = append(g.events, op+" "+ip+" "+state)
		g.mu.Unlock()
	})
	return f, b, g
}

// macHost is peer n's number from its MAC's last byte, in decimal.
func macHost(mac string) string {
	n, _ := strconv.ParseUint(mac[len(mac)-2:], 16, 8)
	return strconv.FormatUint(n, 10)
}

func (g *fakeGate) takeEvents() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.events
	g.events = nil
	return e
}

func TestGateAdmitsBeforeTheFDBEntryAndSettlesAfterItIsGone(t *testing.T) {
	f, b, g := gatedHost(t)

	b.SetPeers(peers(2, 3))
	reconcile(t, b)
	if got, want := g.takeEvents(), []string{"admit", "FDBSet 198.18.0.2 admitted", "FDBSet 198.18.0.3 admitted", "settle"}; !slices.Equal(got, want) {
		t.Errorf("cold start: events %q, want %q", got, want)
	}

	// A peer joins: admitted before its FDB entry is written.
	b.SetPeers(peers(2, 3, 4))
	reconcile(t, b)
	if got, want := g.takeEvents(), []string{"admit", "FDBSet 198.18.0.4 admitted", "settle"}; !slices.Equal(got, want) {
		t.Errorf("join: events %q, want %q", got, want)
	}

	// A peer leaves: still admitted while its FDB entry is removed, gone
	// from the set only after.
	b.SetPeers(peers(2, 4))
	reconcile(t, b)
	if got, want := g.takeEvents(), []string{"admit", "FDBDel 198.18.0.3 admitted", "settle"}; !slices.Equal(got, want) {
		t.Errorf("leave: events %q, want %q", got, want)
	}
	if got, want := g.set(), []string{"198.18.0.2", "198.18.0.4"}; !slices.Equal(got, want) {
		t.Errorf("admitted %q, want %q", got, want)
	}
	_, cfg := fakeHost(t)
	checkState(t, f, dev, golden(cfg, peers(2, 4)))
}

// On a cold start no peer's address receives this host's VXLAN traffic
// yet: a failed Admit holds every peer back, and nothing is written.
func TestGateFailingAdmitWritesNothing(t *testing.T) {
	_, b, g := gatedHost(t)
	g.failWith = syscall.ENOBUFS
	b.SetPeers(peers(2, 3))
	err := b.Reconcile(t.Context())
	if !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("Reconcile = %v, want the gate's error", err)
	}
	if got, want := g.takeEvents(), []string{"admit failed"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q: no FDB entry without its peer admitted", got, want)
	}
	if s := b.Status(); s.InSync || s.PeersProgrammed != 0 {
		t.Errorf("status after a failed admit: in sync %v, %d programmed; want not in sync, 0", s.InSync, s.PeersProgrammed)
	}
	g.failWith = nil
	reconcile(t, b)
	if got := g.set(); !slices.Equal(got, []string{"198.18.0.2", "198.18.0.3"}) {
		t.Errorf("admitted %q after the retry", got)
	}
	if s := b.Status(); !s.InSync || s.PeersProgrammed != 2 {
		t.Errorf("status after the retry: in sync %v, %d programmed; want in sync, 2", s.InSync, s.PeersProgrammed)
	}
}

func TestGateKeepsALeavingPeerWhoseEntriesCouldNotBeRemoved(t *testing.T) {
	f, b, g := gatedHost(t)
	b.SetPeers(peers(2, 3))
	reconcile(t, b)
	g.takeEvents()

	f.Inject(vxlantest.Fault{Op: "FDBDel", Match: "0e:00:00:00:00:03", Err: syscall.EBUSY})
	b.SetPeers(peers(2))
	if err := b.Reconcile(t.Context()); err == nil {
		t.Fatal("Reconcile with a failing FDB delete succeeded")
	}
	if !g.has("198.18.0.3") {
		t.Error("the leaving peer's address was removed while its FDB entry is still there")
	}
	if ev := g.takeEvents(); slices.Contains(ev, "settle") {
		t.Errorf("events %q: settled after a pass with a failed write", ev)
	}
	f.ClearFaults()
	reconcile(t, b)
	if got := g.set(); !slices.Equal(got, []string{"198.18.0.2"}) {
		t.Errorf("admitted %q once the entry is gone, want [198.18.0.2]", got)
	}
}

func TestGateIsToldToResyncOnFullPassesOnly(t *testing.T) {
	_, b, g := gatedHost(t)
	b.SetPeers(peers(2))
	reconcile(t, b) // full: the first pass lists the kernel
	if g.resyncs != 1 {
		t.Fatalf("first pass: %d resyncs, want 1", g.resyncs)
	}
	reconcile(t, b) // Reconcile runs a full pass
	if g.resyncs != 2 {
		t.Errorf("second full pass: %d resyncs, want 2", g.resyncs)
	}
}

// Through Run, where a change of the peers alone brings a pass that
// lists nothing: the same order, with only the peers that came admitted
// (no resync), and the gate settled when peers leave or change address.
func TestGateOrderInIncrementalPasses(t *testing.T) {
	_, b, g := gatedHost(t)
	run(t, b)
	b.SetPeers(peers(2, 3))
	waitSynced(t, b, 2)
	resyncs := func() int { g.mu.Lock(); defer g.mu.Unlock(); return g.resyncs }
	if n := resyncs(); n != 1 {
		t.Fatalf("%d resyncs after the first pass, want 1", n)
	}
	g.takeEvents()

	for _, step := range []struct {
		name   string
		peers  []int
		change func([]backend.Peer) []backend.Peer
		want   []string // the events of the pass
		set    []string
	}{
		{"join", []int{2, 3, 4}, nil, []string{"admit", "FDBSet 198.18.0.4 admitted"}, []string{"198.18.0.2", "198.18.0.3", "198.18.0.4"}},
		{"leave", []int{2, 4}, nil, []string{"admit", "FDBDel 198.18.0.3 admitted", "settle"}, []string{"198.18.0.2", "198.18.0.4"}},
		{"new address", []int{2, 4}, func(ps []backend.Peer) []backend.Peer {
			g.mu.Lock()
			g.moved = map[string]string{"0e:00:00:00:00:04": "198.18.0.44"}
			g.mu.Unlock()
			ps[1] = withIP(ps[1], "198.18.0.44")
			return ps
		}, []string{"admit", "FDBSet 198.18.0.44 admitted", "settle"}, []string{"198.18.0.2", "198.18.0.44"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			ps := peers(step.peers...)
			if step.change != nil {
				ps = step.change(ps)
			}
			b.SetPeers(ps)
			waitSynced(t, b, len(ps))
			if got := g.takeEvents(); !slices.Equal(got, step.want) {
				t.Errorf("events %q, want %q", got, step.want)
			}
			if got := g.set(); !slices.Equal(got, step.set) {
				t.Errorf("admitted %q, want %q", got, step.set)
			}
		})
	}
	if n := resyncs(); n != 1 {
		t.Errorf("%d resyncs: passes woken by SetPeers alone made the gate read the kernel", n)
	}
}

// A Settle that fails leaves the departed peer's address admitted; the
// next pass, even one woken by a lease event alone, must be full so that
// it settles it, not wait for the resync.
func TestGateFailedSettleMakesTheNextPassFull(t *testing.T) {
	f, cfg := fakeHost(t)
	g := newFakeGate()
	cfg.Gate = g
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour // only the lease event wakes the next pass
	b := newBackend(t, cfg, f)
	run(t, b)
	b.SetPeers(peers(2, 3, 4))
	waitSynced(t, b, 3)

	g.mu.Lock()
	g.failSettle = syscall.EIO
	g.mu.Unlock()
	b.SetPeers(peers(2, 4))
	waitFor(t, "the pass whose Settle failed", func() bool { s := b.Status(); return !s.InSync && !s.Pending })
	if !g.has("198.18.0.3") {
		t.Fatal("the fake gate removed the address although its Settle failed")
	}
	b.SetPeers(peers(2, 4, 5))
	waitSynced(t, b, 3)
	if got, want := g.set(), []string{"198.18.0.2", "198.18.0.4", "198.18.0.5"}; !slices.Equal(got, want) {
		t.Errorf("admitted %q after the next lease event, want %q: the departed peer stays admitted until the resync", got, want)
	}
}

// A failed Admit holds back only the peers whose addresses may not be
// admitted: a peer that joins, and one that moved to a new address (which
// keeps its old entries). Meanwhile a peer that left is removed and a
// drifted entry of an admitted peer is repaired; the pass fails, naming
// the held peers, and the retry programs them, admitted first.
func TestGateFailingAdmitHoldsBackOnlyThePeersItDidNotAdmit(t *testing.T) {
	f, b, g := gatedHost(t)
	_, cfg := fakeHost(t)
	b.SetPeers(peers(2, 3, 5))
	reconcile(t, b)
	g.takeEvents()

	// Drift: peer 2's route deleted by someone else.
	routes, err := f.RouteList()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(routes, func(r vxlan.Route) bool { return r.Dst == peer(2).Subnet })
	if i < 0 {
		t.Fatalf("no route to peer 2 in %v", routes)
	}
	if err := f.External(false).RouteDel(routes[i]); err != nil {
		t.Fatal(err)
	}
	// Peer 3 leaves, peer 4 joins, peer 5 moves to 198.18.0.55; the
	// guard fails.
	moved := withIP(peer(5), "198.18.0.55")
	g.mu.Lock()
	g.moved = map[string]string{"0e:00:00:00:00:05": "198.18.0.55"}
	g.failWith = syscall.ENOBUFS
	g.mu.Unlock()
	b.SetPeers([]backend.Peer{peer(2), peer(4), moved})
	err = b.Reconcile(t.Context())
	var ae *vxlan.AdmitError
	if !errors.Is(err, syscall.ENOBUFS) || !errors.As(err, &ae) {
		t.Fatalf("Reconcile = %v, want an AdmitError wrapping the gate's error", err)
	}
	var held []string
	for _, h := range ae.Held {
		held = append(held, h.Subnet.String()+" "+h.PublicIP.String())
	}
	if want := []string{"10.244.4.0/24 198.18.0.4", "10.244.5.0/24 198.18.0.55"}; !slices.Equal(held, want) {
		t.Errorf("held back %q, want %q", held, want)
	}
	if got, want := g.takeEvents(), []string{"admit failed", "FDBDel 198.18.0.3 admitted"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q: the departure removed, no FDB entry for an address not admitted", got, want)
	}
	// Peer 2 repaired, peer 3 gone, peer 4 absent, peer 5 as it was.
	checkState(t, f, dev, golden(cfg, peers(2, 5)))
	s := b.Status()
	if s.InSync || s.PeersProgrammed != 1 {
		t.Errorf("status: in sync %v, %d programmed; want not in sync, 1 (peer 2)", s.InSync, s.PeersProgrammed)
	}
	if s.LastError == nil || !strings.Contains(s.LastError.Error(), "2 peers held back until the guard admits their addresses (first 10.244.4.0/24 at 198.18.0.4)") {
		t.Errorf("status error %v does not say which peers wait", s.LastError)
	}

	g.mu.Lock()
	g.failWith = nil
	g.mu.Unlock()
	reconcile(t, b)
	if got, want := g.takeEvents(), []string{"admit", "FDBSet 198.18.0.4 admitted", "FDBSet 198.18.0.55 admitted", "settle"}; !slices.Equal(got, want) {
		t.Errorf("retry: events %q, want %q", got, want)
	}
	checkState(t, f, dev, golden(cfg, []backend.Peer{peer(2), peer(4), moved}))
	if got, want := g.set(), []string{"198.18.0.2", "198.18.0.4", "198.18.0.55"}; !slices.Equal(got, want) {
		t.Errorf("admitted %q after the retry, want %q", got, want)
	}
	if s := b.Status(); !s.InSync || s.PeersProgrammed != 3 {
		t.Errorf("status after the retry: in sync %v, %d programmed; want in sync, 3", s.InSync, s.PeersProgrammed)
	}
}

// DirectRouting peers are routed over the underlay, not VXLAN: a failed
// Admit does not hold them back.
func TestGateFailingAdmitDoesNotHoldBackDirectPeers(t *testing.T) {
	f, cfg := fakeHost(t)
	cfg.DirectRouting = true
	g := newFakeGate()
	g.failWith = syscall.EIO
	cfg.Gate = g
	b := newBackend(t, cfg, f)
	far := withIP(peer(9), "198.19.0.9") // not on the underlay's subnet: VXLAN
	b.SetPeers([]backend.Peer{peer(2), far})
	err := b.Reconcile(t.Context())
	var ae *vxlan.AdmitError
	if !errors.As(err, &ae) || len(ae.Held) != 1 || ae.Held[0] != far {
		t.Fatalf("Reconcile = %v, want an AdmitError holding back %v only", err, far.Subnet)
	}
	checkState(t, f, dev, goldenWith(cfg, peers(2), []netip.Prefix{peer(2).Subnet}, nil))
}

// Through Run: a lease event alone (an incremental pass) with the guard
// failing removes the peer that left and holds back the one that came;
// the failing retries log one warning between them, not one per pass,
// and the first retry after the guard recovers programs the held peer.
func TestGateFailingAdmitInRunRetriesAndLogsOnce(t *testing.T) {
	f, cfg := fakeHost(t)
	log, lb := newLogger(t)
	cfg.Logger = log
	g := newFakeGate()
	cfg.Gate = g
	cfg.RetryMin, cfg.RetryMax = time.Millisecond, 10*time.Millisecond
	b := newBackend(t, cfg, f)
	run(t, b)
	b.SetPeers(peers(2, 3))
	waitSynced(t, b, 2)

	g.mu.Lock()
	g.failWith = syscall.ENOBUFS
	g.mu.Unlock()
	errs := b.Status().Errors
	b.SetPeers(peers(2, 4))
	waitState(t, f, dev, golden(cfg, peers(2)))
	waitFor(t, "5 failed passes", func() bool { return b.Status().Errors >= errs+5 })
	if n := lb.count("reconcile pass failed; retrying with backoff"); n != 1 {
		t.Errorf("%d warnings over %d failed passes, want 1", n, b.Status().Errors-errs)
	}
	if err := b.Status().LastError; err == nil || !strings.Contains(err.Error(), "peer 10.244.4.0/24 at 198.18.0.4 held back until the guard admits its address") {
		t.Errorf("status error %v does not name the held peer", err)
	}

	g.mu.Lock()
	g.failWith = nil
	g.mu.Unlock()
	waitSynced(t, b, 2)
	checkState(t, f, dev, golden(cfg, peers(2, 4)))
	if got, want := g.set(), []string{"198.18.0.2", "198.18.0.4"}; !slices.Equal(got, want) {
		t.Errorf("admitted %q, want %q", got, want)
	}
	if n := lb.count("back in sync"); n != 1 {
		t.Errorf("%d \"back in sync\" lines, want 1", n)
	}
}
