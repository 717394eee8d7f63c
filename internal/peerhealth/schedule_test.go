package peerhealth

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
)

// peersOf returns n IPv4 peers, 10.<i>.<j>.0/24.
func peersOf(n int) []backend.Peer {
	out := make([]backend.Peer, n)
	for i := range n {
		sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
		out[i] = backend.Peer{Subnet: sn, PublicIP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})}
	}
	return out
}

// keyOf is an IPv4 peer's key.
func keyOf(pe backend.Peer) Key { return Key{Family: backend.IPv4, Subnet: pe.Subnet} }

// each calls f with every peer s probes, in no order.
func each(s *schedule, f func(k Key, e *entry)) {
	for i := range s.peers {
		f(s.peers[i].key.Key(), &s.peers[i])
	}
}

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// simulate runs the schedule on a fake clock for d, every probe answered
// after rtt unless lose says it is lost (found at send time + timeout),
// and returns each send's time and peer.
type send struct {
	at  time.Time
	key Key
}

func simulate(s *schedule, d, rtt time.Duration, lose func(Key, int) bool) []send {
	var out []send
	now := t0
	type pending struct {
		key  Key
		at   time.Time
		lost bool
	}
	var inflight []pending
	n := 0
	for {
		e, at := s.next()
		// Resolve every probe whose outcome comes before the next send.
		for len(inflight) > 0 && (e == nil || !inflight[0].at.After(at)) {
			f := inflight[0]
			inflight = inflight[1:]
			if f.lost {
				s.lost(f.key, f.at)
			} else {
				s.answered(f.key, rtt, f.at)
			}
			e, at = s.next()
		}
		if e == nil || at.Sub(t0) > d {
			return out
		}
		if at.Before(now) {
			panic(fmt.Sprintf("time went back: %s before %s", at, now))
		}
		now = at
		s.sent(e, now)
		k := e.key.Key()
		out = append(out, send{now, k})
		lost := lose != nil && lose(k, n)
		n++
		end := now.Add(rtt)
		if lost {
			end = now.Add(s.set.Timeout)
		}
		// Keep inflight sorted by end (timeouts end later than answers).
		i := len(inflight)
		for i > 0 && inflight[i-1].at.After(end) {
			i--
		}
		inflight = append(inflight[:i], append([]pending{{k, end, lost}}, inflight[i:]...)...)
	}
}

// checkRate fails if any window of one second holds more than rate sends.
func checkRate(t *testing.T, sends []send, rate float64) {
	t.Helper()
	j := 0
	for i := range sends {
		for sends[i].at.Sub(sends[j].at) >= time.Second {
			j++
		}
		if n := i - j + 1; float64(n) > rate {
			t.Fatalf("%d probes within one second ending %s: over the rate bound %v", n, sends[i].at.Sub(t0), rate)
		}
	}
}

func TestScheduleRateAndSweep(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers int
		set   Settings
		// sweep is the longest a peer may wait between two probes (and
		// for its first): the sweep, or 1.25 × peers / rate, plus jitter
		// (10 %) and the rate's queueing.
		sweep time.Duration
	}{
		{"10 peers fit the 30 s sweep", 10, Settings{Sweep: 30 * time.Second, Rate: 100}, 34 * time.Second},
		{"10,000 peers stretch the sweep to the rate", 10000, Settings{Sweep: 30 * time.Second, Rate: 100}, 138 * time.Second},
		{"10,000 peers at 1000/s", 10000, Settings{Sweep: 30 * time.Second, Rate: 1000}, 34 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSchedule(tc.set, rand.New(rand.NewPCG(1, 2)))
			s.setPeers(t0, peersOf(tc.peers), nil)
			sends := simulate(s, 4*tc.sweep, time.Millisecond, nil)
			checkRate(t, sends, tc.set.Rate)
			last := map[Key]time.Time{}
			for _, sd := range sends {
				from := t0
				if l, ok := last[sd.key]; ok {
					from = l
				}
				if gap := sd.at.Sub(from); gap > tc.sweep {
					t.Fatalf("peer %s waited %s for a probe, more than the sweep %s", sd.key.Subnet, gap, tc.sweep)
				}
				last[sd.key] = sd.at
			}
			if len(last) != tc.peers {
				t.Fatalf("%d of %d peers probed", len(last), tc.peers)
			}
			for k, l := range last {
				if end := t0.Add(4 * tc.sweep); end.Sub(l) > tc.sweep {
					t.Fatalf("peer %s last probed %s before the end", k.Subnet, end.Sub(l))
				}
			}
			// Not all at once either: no more probes than the sweep needs.
			if perSweep := float64(len(sends)) / 4; perSweep > 1.2*float64(tc.peers)+1 {
				t.Fatalf("%.0f probes per sweep for %d peers", perSweep, tc.peers)
			}
		})
	}
}

func TestScheduleLossRetriesWithinRate(t *testing.T) {
	// Every peer's probes are lost: each is retried at once until it is
	// unreachable, and the rate bound holds with the retries.
	set := Settings{Sweep: 10 * time.Second, Rate: 50, Timeout: time.Second, Threshold: 3}
	s := newSchedule(set, rand.New(rand.NewPCG(3, 4)))
	s.setPeers(t0, peersOf(1000), nil)
	sends := simulate(s, 200*time.Second, time.Millisecond, func(Key, int) bool { return true })
	checkRate(t, sends, set.Rate)
	each(s, func(k Key, e *entry) {
		if e.state != Unreachable || e.sent < 3 {
			t.Fatalf("peer %s: %s after %d probes, want unreachable", k.Subnet, e.state, e.sent)
		}
	})
}

func TestScheduleDetectsWithinSweepPlusRetries(t *testing.T) {
	// A peer that stops answering is reported within one sweep plus
	// Threshold timeouts (and the rate's gaps).
	set := Settings{Sweep: 30 * time.Second, Rate: 100, Timeout: time.Second, Threshold: 3}
	s := newSchedule(set, rand.New(rand.NewPCG(5, 6)))
	peers := peersOf(100)
	s.setPeers(t0, peers, nil)
	dead := keyOf(peers[rand.New(rand.NewPCG(5, 7)).IntN(len(peers))])
	simulate(s, 200*time.Second, time.Millisecond, func(k Key, _ int) bool { return k == dead })
	// simulate loses every probe of dead from the start: it is down
	// within the first sweep plus 3 timeouts.
	e := s.lookup(dead)
	if e.state != Unreachable {
		t.Fatalf("dead peer is %s", e.state)
	}
	if limit := t0.Add(set.Sweep + 3*set.Timeout + time.Second); s.wall(e.since).After(limit) {
		t.Fatalf("dead peer reported unreachable at +%s, later than a sweep and 3 timeouts", s.wall(e.since).Sub(t0))
	}
	each(s, func(k Key, e *entry) {
		if k != dead && e.state != Reachable {
			t.Fatalf("peer %s is %s", k.Subnet, e.state)
		}
	})
}

// A peer that goes dark right after one of its probes was answered (the
// worst moment: its next probe is as far off as it gets) is reported
// within one sweep plus Threshold timeouts of going dark, and the rate's
// spacing of its probes: its next probe is never more than a sweep after
// the last, and each loss is retried at once. On a fake clock, for 300
// peers and phases.
func TestScheduleDetectsWithinOneSweepOfGoingDark(t *testing.T) {
	set := Settings{Sweep: 30 * time.Second, Rate: 100, Timeout: time.Second, Threshold: 3}
	const rtt = time.Millisecond
	gap := time.Second / time.Duration(set.Rate)
	bound := set.Sweep + time.Duration(set.Threshold)*set.Timeout + time.Duration(set.Threshold)*gap
	var worst time.Duration
	for trial := range 300 {
		s := newSchedule(set, rand.New(rand.NewPCG(uint64(trial), 77)))
		peers := peersOf(100)
		s.setPeers(t0, peers, nil)
		dead := Key{Family: backend.IPv4, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(trial % 100), 0}), 24)}
		// It goes dark just after the answer to its first probe after a
		// warm-up at a random time within two sweeps.
		warm := t0.Add(time.Duration(rand.New(rand.NewPCG(uint64(trial), 78)).Int64N(int64(2 * set.Sweep))))
		var dark time.Time
		simulate(s, warm.Sub(t0)+3*set.Sweep, rtt, func(k Key, _ int) bool {
			if k != dead {
				return false
			}
			sentAt := s.wall(s.last) // simulate calls this just after s.sent
			switch {
			case dark.IsZero() && !sentAt.Before(warm):
				dark = sentAt.Add(rtt + time.Nanosecond) // this one is answered
				return false
			case dark.IsZero():
				return false
			}
			return !sentAt.Before(dark)
		})
		e := s.lookup(dead)
		if dark.IsZero() || e.state != Unreachable {
			t.Fatalf("trial %d: peer %s is %s (dark at %v)", trial, dead.Subnet, e.state, dark)
		}
		took := s.wall(e.since).Sub(dark)
		if took > bound {
			t.Fatalf("trial %d: peer %s reported unreachable %s after going dark, over the bound of one sweep, %d timeouts and the rate's gaps (%s)",
				trial, dead.Subnet, took, set.Threshold, bound)
		}
		worst = max(worst, took)
		each(s, func(k Key, o *entry) {
			if k != dead && o.state != Reachable {
				t.Fatalf("trial %d: peer %s is %s", trial, k.Subnet, o.state)
			}
		})
	}
	// The test met the worst case: its next probe a whole (jittered)
	// sweep away.
	if low := set.Sweep*9/10 + time.Duration(set.Threshold)*set.Timeout; worst < low {
		t.Fatalf("the slowest detection took %s: the test never blocked a peer right after a probe (want over %s)", worst, low)
	}
	t.Logf("slowest detection of 300: %s (bound %s)", worst, bound)
}

func TestScheduleSetPeers(t *testing.T) {
	s := newSchedule(Settings{Sweep: time.Second, Rate: 100}, rand.New(rand.NewPCG(7, 8)))
	peers := peersOf(3)
	s.setPeers(t0, peers, nil)
	e, _ := s.next()
	s.sent(e, t0)
	gone := e.key.Key()
	peers = slices.DeleteFunc(peers, func(pe backend.Peer) bool { return keyOf(pe) == gone })
	s.setPeers(t0, peers, nil)
	if s.lookup(gone) != nil || len(s.due) != 2 || len(s.peers) != 2 {
		t.Fatalf("removed peer kept: %d due, %d known", len(s.due), len(s.peers))
	}
	// Its probe ending after it left changes nothing.
	if e, back := s.answered(gone, time.Millisecond, t0); e != nil || back {
		t.Fatal("an answer for a removed peer was recorded")
	}
	// A peer kept keeps its record.
	for _, pe := range peers {
		s.lookup(keyOf(pe)).received = 7
	}
	s.setPeers(t0.Add(time.Second), peers, nil)
	for _, pe := range peers {
		if s.lookup(keyOf(pe)).received != 7 {
			t.Fatalf("peer %s lost its record on a new peer set", pe.Subnet)
		}
	}
}

func TestJitterBounds(t *testing.T) {
	s := newSchedule(Settings{}, rand.New(rand.NewPCG(9, 10)))
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 10000 {
		d := s.jittered(30 * time.Second)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 27*time.Second || hi > 30*time.Second {
		t.Fatalf("jittered 30 s spans %s..%s, outside 27 s..30 s (never longer: the detection bound)", lo, hi)
	}
	if hi-lo < 2500*time.Millisecond {
		t.Fatalf("jittered 30 s spans only %s..%s: not spread", lo, hi)
	}
	// First probes of a cold start's peers spread over the whole sweep.
	s.setPeers(t0, peersOf(1000), nil)
	var first, last time.Time
	for _, i := range s.due {
		due := s.wall(s.peers[i].due)
		if first.IsZero() || due.Before(first) {
			first = due
		}
		if due.After(last) {
			last = due
		}
	}
	if first.Sub(t0) > time.Second || last.Sub(t0) < 25*time.Second || last.Sub(t0) > 30*time.Second {
		t.Fatalf("first probes span +%s..+%s, want spread over the 30 s sweep", first.Sub(t0), last.Sub(t0))
	}
}

func TestStateMachine(t *testing.T) {
	var h entry
	at := func(s int) int64 { return int64(time.Duration(s) * time.Second) }
	if back := h.answered(8*time.Millisecond, at(1)); back || h.state != Reachable || h.since != at(1) {
		t.Fatalf("first answer: state %s since %d back %v", h.state, h.since, back)
	}
	h.answered(16*time.Millisecond, at(2))
	if h.srtt != 9*time.Millisecond || h.lastRTT != 16*time.Millisecond {
		t.Fatalf("smoothed RTT %s last %s, want 9ms (8 + (16-8)/8) and 16ms", h.srtt, h.lastRTT)
	}
	for i, want := range []bool{false, false, true, false} {
		if down := h.lostOne(3, at(3+i)); down != want {
			t.Fatalf("loss %d: down %v, want %v", i+1, down, want)
		}
	}
	if h.state != Unreachable || h.since != at(5) || h.losses != 4 || h.lost != 4 {
		t.Fatalf("after 4 losses: %s since %d, %d in a row, %d lost", h.state, h.since, h.losses, h.lost)
	}
	if back := h.answered(time.Millisecond, at(9)); !back || h.state != Reachable || h.losses != 0 || h.since != at(9) {
		t.Fatalf("answer after being down: back %v state %s losses %d", back, h.state, h.losses)
	}
	// A peer never answering goes from unknown to unreachable.
	var n entry
	n.lostOne(2, at(1))
	if n.state != Unknown {
		t.Fatalf("one loss of a new peer: %s", n.state)
	}
	if !n.lostOne(2, at(2)) || n.state != Unreachable {
		t.Fatalf("two losses of a new peer: %s", n.state)
	}
	// The 32-bit counters stop at their ceiling: a report never goes
	// backwards.
	n.lost, n.losses, n.received = math.MaxUint32, math.MaxUint32, math.MaxUint32
	n.lostOne(2, at(3))
	n.answered(time.Millisecond, at(4))
	if n.lost != math.MaxUint32 || n.received != math.MaxUint32 {
		t.Fatalf("counters at their ceiling moved to %d lost, %d received", n.lost, n.received)
	}
}

func TestSettingsCheck(t *testing.T) {
	for _, tc := range []struct {
		set Settings
		ok  bool
	}{
		{Settings{Sweep: 30 * time.Second, Rate: 100}, true},
		{Settings{Sweep: time.Millisecond, Rate: 100}, false},
		{Settings{Sweep: time.Second, Rate: 0}, false},
		{Settings{Sweep: time.Second, Rate: MaxRate + 1}, false},
	} {
		if err := tc.set.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.set, err)
		}
	}
}

// A cold start's thousands are ordered at once, later arrivals one by
// one: either way every peer is queued once, at its place, and probes go
// out in the order they are due.
func TestScheduleSetPeersInBulkKeepsTheQueueOrdered(t *testing.T) {
	s := newSchedule(Settings{Sweep: time.Minute, Rate: 1000}, rand.New(rand.NewPCG(3, 4)))
	s.setPeers(t0, peersOf(500), nil) // bulk: more new than queued
	more := peersOf(510)
	s.setPeers(t0.Add(time.Second), more, nil) // 10 more, pushed
	if len(s.due) != 510 || len(s.peers) != 510 {
		t.Fatalf("%d queued, %d known; want 510 and 510", len(s.due), len(s.peers))
	}
	for h, i := range s.due {
		if e := &s.peers[i]; int(e.index) != h {
			t.Fatalf("entry at %d says it is at %d", h, e.index)
		}
	}
	seen := map[Key]bool{}
	var last time.Time
	for range 510 {
		e, _ := s.next()
		if e == nil {
			t.Fatal("queue ran dry early")
		}
		due := s.wall(e.due)
		if due.Before(last) {
			t.Fatalf("%s due %s after one due %s: out of order", e.key.Key().Subnet, due, last)
		}
		last = due
		seen[e.key.Key()] = true
		s.sent(e, due)
	}
	if len(seen) != 510 {
		t.Errorf("%d distinct peers probed, want 510", len(seen))
	}
}
