package peerhealth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// fakePinger answers every request at once, except to the targets in
// dead.
type fakePinger struct {
	mu      sync.Mutex
	dead    map[netip.Addr]bool
	sent    atomic.Int64
	replies chan [2]any
	closed  chan struct{}
	once    sync.Once
}

func newFakePinger() *fakePinger {
	return &fakePinger{dead: map[netip.Addr]bool{}, replies: make(chan [2]any, 1024), closed: make(chan struct{})}
}

func (f *fakePinger) setDead(a netip.Addr, dead bool) {
	f.mu.Lock()
	f.dead[a] = dead
	f.mu.Unlock()
}

func (f *fakePinger) Send(dst netip.Addr, seq uint16) error {
	f.sent.Add(1)
	f.mu.Lock()
	dead := f.dead[dst]
	f.mu.Unlock()
	if !dead {
		f.replies <- [2]any{dst, seq}
	}
	return nil
}

func (f *fakePinger) Receive() (netip.Addr, uint16, error) {
	select {
	case r := <-f.replies:
		return r[0].(netip.Addr), r[1].(uint16), nil
	case <-f.closed:
		return netip.Addr{}, 0, net.ErrClosed
	}
}

func (f *fakePinger) Close() error { f.once.Do(func() { close(f.closed) }); return nil }

// syncBuf is a log sink several goroutines write.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stateOf(p *Prober, subnet string) State {
	for _, ph := range p.Peers() {
		if ph.Peer == subnet {
			return ph.State
		}
	}
	return Unknown
}

func TestProberReportsDeadPeerAndItsReturn(t *testing.T) {
	pg := newFakePinger()
	var logs syncBuf
	var hold atomic.Bool
	var holdAsked atomic.Int64
	hold.Store(true)
	var answered, lost atomic.Int64
	p := New(Config{Settings: Settings{Sweep: 300 * time.Millisecond, Rate: 200, Timeout: 50 * time.Millisecond, Threshold: 2},
		Families: []backend.Family{backend.IPv4}, Open: func(backend.Family) (Pinger, error) { return pg, nil },
		Hold: func() bool { holdAsked.Add(1); return hold.Load() }, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnResult: func(_ backend.Family, ok bool, _ time.Duration) {
			if ok {
				answered.Add(1)
			} else {
				lost.Add(1)
			}
		}})
	var peers []backend.Peer
	for i := 1; i <= 3; i++ {
		peers = append(peers, backend.Peer{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24), PublicIP: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)})})
	}
	p.SetPeers(backend.IPv4, peers)
	pg.setDead(netip.MustParseAddr("10.244.2.0"), true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "the prober to start", 5*time.Second, func() bool { return p.Summary().Probing })
	// A held prober asks again and again; nothing may go out meanwhile.
	waitFor(t, "the prober to ask 3 times whether it is held", 5*time.Second, func() bool { return holdAsked.Load() >= 3 })
	if n := pg.sent.Load(); n != 0 {
		t.Fatalf("%d probes sent while held", n)
	}
	hold.Store(false)
	waitFor(t, "10.244.2.0/24 unreachable, the others reachable", 5*time.Second, func() bool {
		return stateOf(p, "10.244.2.0/24") == Unreachable && stateOf(p, "10.244.1.0/24") == Reachable && stateOf(p, "10.244.3.0/24") == Reachable
	})
	if !strings.Contains(logs.String(), `msg="peer unreachable" peer=10.244.2.0/24`) {
		t.Fatalf("no log line naming the unreachable peer:\n%s", logs.String())
	}
	if strings.Count(logs.String(), "peer unreachable") != 1 {
		t.Fatalf("want exactly one unreachable line:\n%s", logs.String())
	}
	sum := p.Summary()
	if sum.IPv4.Unreachable != 1 || sum.IPv4.Reachable != 2 || len(sum.Worst) == 0 || sum.Worst[0].Peer != "10.244.2.0/24" {
		t.Fatalf("summary %+v", sum)
	}
	if answered.Load() == 0 || lost.Load() < 2 {
		t.Fatalf("results: %d answered, %d lost", answered.Load(), lost.Load())
	}
	pg.setDead(netip.MustParseAddr("10.244.2.0"), false)
	waitFor(t, "10.244.2.0/24 reachable again", 5*time.Second, func() bool { return stateOf(p, "10.244.2.0/24") == Reachable })
	if !strings.Contains(logs.String(), `msg="peer reachable again" peer=10.244.2.0/24`) {
		t.Fatalf("no log line for the peer's return:\n%s", logs.String())
	}
	// A peer leaving the set leaves the report.
	p.SetPeers(backend.IPv4, peers[:1])
	waitFor(t, "two peers dropped", 5*time.Second, func() bool { return len(p.Peers()) == 1 })
}

func TestProberWithoutSocketKeepsRunning(t *testing.T) {
	var logs syncBuf
	p := New(Config{Families: []backend.Family{backend.IPv4}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Open: func(fam backend.Family) (Pinger, error) {
			return nil, noSocketError(fam, errors.New("permission denied"), errors.New("operation not permitted"))
		}})
	p.SetPeers(backend.IPv4, []backend.Peer{{Subnet: netip.MustParsePrefix("10.244.1.0/24"), PublicIP: netip.MustParseAddr("198.18.0.1")}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	waitFor(t, "the problem reported", 5*time.Second, func() bool { return len(p.Summary().Problems) == 1 })
	sum := p.Summary()
	if sum.Probing || !strings.Contains(sum.Problems[0], "ping_group_range") || !strings.Contains(sum.Problems[0], "CAP_NET_RAW") {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.Contains(logs.String(), "cannot probe peers") {
		t.Fatalf("no error logged:\n%s", logs.String())
	}
	select {
	case <-done:
		t.Fatal("Run returned before its context ended")
	default:
	}
	cancel()
	<-done
}

// deadPinger is a socket bound to a device that is gone: every send fails.
type deadPinger struct{ closed chan struct{} }

func (d *deadPinger) Send(netip.Addr, uint16) error {
	return fmt.Errorf("write: %w", unix.ENODEV)
}
func (d *deadPinger) Receive() (netip.Addr, uint16, error) {
	<-d.closed
	return netip.Addr{}, 0, net.ErrClosed
}
func (d *deadPinger) Close() error {
	select {
	case <-d.closed:
	default:
		close(d.closed)
	}
	return nil
}

func TestProberReopensASocketThatCannotSend(t *testing.T) {
	good := newFakePinger()
	var opened atomic.Int64
	p := New(Config{Settings: Settings{Sweep: 300 * time.Millisecond, Rate: 100, Timeout: 50 * time.Millisecond},
		Families: []backend.Family{backend.IPv4},
		Open: func(backend.Family) (Pinger, error) {
			if opened.Add(1) == 1 {
				return &deadPinger{closed: make(chan struct{})}, nil
			}
			return good, nil
		}})
	p.SetPeers(backend.IPv4, []backend.Peer{{Subnet: netip.MustParsePrefix("10.244.1.0/24"), PublicIP: netip.MustParseAddr("198.18.0.1")}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the peer reachable through the reopened socket", 5*time.Second, func() bool { return stateOf(p, "10.244.1.0/24") == Reachable })
	if n := opened.Load(); n != 2 {
		t.Fatalf("socket opened %d times, want 2", n)
	}
	if r := p.Peers()[0]; r.Lost == 0 {
		t.Fatalf("the failed send was not counted lost: %+v", r)
	}
}

// unroutedPinger answers every request except those to unrouted, whose
// send fails as a kernel without a route fails it; its first badReads
// reads fail.
type unroutedPinger struct {
	*fakePinger
	unrouted netip.Addr
	badReads atomic.Int64
}

func (u *unroutedPinger) Send(dst netip.Addr, seq uint16) error {
	if dst == u.unrouted {
		return fmt.Errorf("write: %w", unix.EHOSTUNREACH)
	}
	return u.fakePinger.Send(dst, seq)
}

func (u *unroutedPinger) Receive() (netip.Addr, uint16, error) {
	if u.badReads.Add(-1) >= 0 {
		return netip.Addr{}, 0, fmt.Errorf("read: %w", unix.ENOBUFS)
	}
	return u.fakePinger.Receive()
}

// A send failing for one peer (no route to it) is that peer's loss: the
// socket is not reopened, the other peers' probes go on. A failed read
// does not end the receiving either.
func TestProberKeepsSocketOnAPeersSendError(t *testing.T) {
	pg := &unroutedPinger{fakePinger: newFakePinger(), unrouted: netip.MustParseAddr("10.244.2.0")}
	pg.badReads.Store(3)
	var opened atomic.Int64
	var logs syncBuf
	p := New(Config{Settings: Settings{Sweep: 300 * time.Millisecond, Rate: 100, Timeout: 50 * time.Millisecond, Threshold: 2},
		Families: []backend.Family{backend.IPv4}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Open: func(backend.Family) (Pinger, error) { opened.Add(1); return pg, nil }})
	p.SetPeers(backend.IPv4, []backend.Peer{
		{Subnet: netip.MustParsePrefix("10.244.1.0/24"), PublicIP: netip.MustParseAddr("198.18.0.1")},
		{Subnet: netip.MustParsePrefix("10.244.2.0/24"), PublicIP: netip.MustParseAddr("198.18.0.2")},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "10.244.2.0/24 unreachable, 10.244.1.0/24 reachable", 5*time.Second, func() bool {
		return stateOf(p, "10.244.2.0/24") == Unreachable && stateOf(p, "10.244.1.0/24") == Reachable
	})
	if n := opened.Load(); n != 1 {
		t.Fatalf("socket opened %d times, want 1: a peer's send error must not reopen it", n)
	}
	if n := strings.Count(logs.String(), "cannot read a probe reply"); n != 1 {
		t.Fatalf("failed reads logged %d times, want once:\n%s", n, logs.String())
	}
}

// The worst peers are the unreachable ones, longest first, then those
// with most losses in a row, then the slowest; at most WorstPeers.
func TestSummaryWorst(t *testing.T) {
	p := New(Config{Families: []backend.Family{backend.IPv4}})
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	peers := peersOf(9)
	p.s.setPeers(t0, peers, nil)
	var keys []Key
	for _, pe := range peers {
		keys = append(keys, keyOf(pe))
	}
	slices.SortFunc(keys, func(a, b Key) int { return a.Subnet.Addr().Compare(b.Subnet.Addr()) })
	set := func(i int, st State, since time.Time, losses uint32, srtt time.Duration) {
		h := p.s.lookup(keys[i])
		h.state, h.since, h.losses, h.srtt = st, p.s.at(since), losses, srtt
	}
	set(0, Reachable, at(0), 0, time.Millisecond)
	set(1, Unreachable, at(50), 7, 0)
	set(2, Reachable, at(0), 2, time.Millisecond)
	set(3, Unreachable, at(10), 9, 0)
	set(4, Reachable, at(0), 0, 5*time.Millisecond)
	set(5, Reachable, at(0), 0, 3*time.Millisecond)
	set(6, Reachable, at(0), 0, 2*time.Millisecond)
	// 7 and 8: nothing known against them (unknown, never answered).
	var got []string
	for _, w := range p.Summary().Worst {
		got = append(got, w.Peer)
	}
	var want []string
	for _, i := range []int{3, 1, 2, 4, 5} {
		want = append(want, keys[i].Subnet.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("worst %q, want %q", got, want)
	}
	if v4, _ := p.Counts(); v4.Reachable != 5 || v4.Unreachable != 2 || v4.Unknown != 2 {
		t.Fatalf("counts %+v", v4)
	}
}
