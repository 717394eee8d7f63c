package peerhealth

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"
)

// Settings bound the prober's work on this host.
type Settings struct {
	// Sweep is how often every peer is probed (default 30 s): the period
	// of each peer's probes while the rate allows it. With more peers than
	// Rate×Sweep the sweep stretches to about Peers/Rate (with headroom,
	// see period), so the rate bound always holds.
	Sweep time.Duration
	// Rate is the most probes sent per second, retries included (default
	// 100): a floor on the time between two probes, whatever the number
	// of peers.
	Rate float64
	// Timeout is how long a probe waits for its answer (default 1 s, at
	// most Sweep/2).
	Timeout time.Duration
	// Threshold is the number of probes lost in a row that makes a peer
	// Unreachable (default 3). After a loss the peer is probed again at
	// once (within the rate) rather than a sweep later, and a peer's
	// probes are never more than a period apart (jitter only shortens
	// it), so a peer that goes dark is reported within one period (the
	// sweep, or longer with more peers than the rate allows in it) plus
	// Threshold timeouts of going dark, and the rate's spacing of those
	// probes.
	Threshold int
}

// Defaults of Settings.
const (
	DefaultSweep     = 30 * time.Second
	DefaultRate      = 100
	DefaultTimeout   = time.Second
	DefaultThreshold = 3
	// MaxRate bounds --peer-probe-rate: above it the probes cost more
	// than they tell.
	MaxRate = 10000
	// MinSweep bounds --peer-probe-sweep from below.
	MinSweep = 100 * time.Millisecond
)

// jitter is the spread of each peer's period, 10 %, so probes of peers
// that arrived together (a cold start) drift apart and no two hosts probe
// in lock step. It only shortens the period (90 to 100 % of it): a
// longer one would stretch the detection bound (see Threshold) by as
// much, and the average rate stays well under the bound (headroom).
const jitter = 0.1

// headroom is how far below the rate bound a sweep's average rate stays
// when the peers fill it (period): at exactly the bound the queue of due
// probes would grow without limit under jitter and retries.
const headroom = 1.25

func (s *Settings) defaults() {
	if s.Sweep <= 0 {
		s.Sweep = DefaultSweep
	}
	if s.Rate <= 0 {
		s.Rate = DefaultRate
	}
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	s.Timeout = min(s.Timeout, s.Sweep/2)
	if s.Threshold <= 0 {
		s.Threshold = DefaultThreshold
	}
}

// Check says what is wrong with s, naming the flag to fix.
func (s Settings) Check() error {
	switch {
	case s.Sweep < MinSweep:
		return fmt.Errorf("--peer-probe-sweep %s: must be at least %s (0 turns probing off with --peer-probe=false)", s.Sweep, MinSweep)
	case !(s.Rate >= 1 && s.Rate <= MaxRate): // also NaN
		return fmt.Errorf("--peer-probe-rate %v: must be between 1 and %d probes per second", s.Rate, MaxRate)
	}
	return nil
}

// entry is one peer in the schedule.
type entry struct {
	key    Key
	public netip.Addr // the peer's underlay address, for reports
	h      health
	due    time.Time // when its next probe is due
	sentAt time.Time // when the probe in flight was sent
	index  int       // in the due heap; -1 while a probe is in flight
}

// schedule decides which peer is probed when: each peer once a period, in
// random phase, with jitter, and retries after a loss, never two probes
// closer than 1/Rate. It is pure: every method is told the time.
type schedule struct {
	set   Settings
	rnd   *rand.Rand
	peers map[Key]*entry
	due   dueHeap
	// last is when the last probe was sent: the next one goes no sooner
	// than last + gap.
	last time.Time
	gap  time.Duration
}

func newSchedule(set Settings, rnd *rand.Rand) *schedule {
	set.defaults()
	return &schedule{set: set, rnd: rnd, peers: map[Key]*entry{}, gap: time.Duration(float64(time.Second) / set.Rate)}
}

// period is how often each peer is probed: Sweep, or longer when that
// many peers at Rate take longer (with headroom).
func (s *schedule) period() time.Duration {
	need := time.Duration(float64(len(s.peers)) * headroom * float64(time.Second) / s.set.Rate)
	return max(s.set.Sweep, need)
}

// jittered is d shortened by up to jitter: between (1-jitter)×d and d.
func (s *schedule) jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 - jitter*s.rnd.Float64()))
}

// setPeers makes peers the set probed: new ones are first probed at a
// random time within a period (so a cold start's thousands spread over
// the sweep), gone ones are forgotten (a probe in flight for one is
// ignored when it ends). Peers kept keep their record and schedule.
func (s *schedule) setPeers(now time.Time, peers map[Key]netip.Addr) {
	for k, e := range s.peers {
		if _, ok := peers[k]; !ok {
			if e.index >= 0 {
				heap.Remove(&s.due, e.index)
			}
			delete(s.peers, k)
		}
	}
	if len(s.peers) == 0 && len(peers) > 0 {
		// The first set (a cold start's thousands): sized once rather
		// than grown entry by entry.
		s.peers = make(map[Key]*entry, len(peers))
	}
	added := make([]*entry, 0, max(0, len(peers)-len(s.peers)))
	for k, pub := range peers {
		if e, ok := s.peers[k]; ok {
			e.public = pub
			continue
		}
		e := &entry{key: k, public: pub, h: health{since: now}, index: -1}
		s.peers[k] = e
		added = append(added, e)
	}
	p := s.period() // with the new peers counted
	for _, e := range added {
		e.due = now.Add(time.Duration(s.rnd.Float64() * float64(p)))
	}
	if len(added) <= len(s.due) {
		for _, e := range added {
			heap.Push(&s.due, e)
		}
		return
	}
	// More new peers than queued ones: order them all at once, in linear
	// time, instead of pushing each.
	for _, e := range added {
		e.index = len(s.due)
		s.due = append(s.due, e)
	}
	heap.Init(&s.due)
}

// next is the peer whose probe is due first and when it may be sent (its
// due time or the rate's, whichever is later); nil if every peer has a
// probe in flight or there is none.
func (s *schedule) next() (*entry, time.Time) {
	if len(s.due) == 0 {
		return nil, time.Time{}
	}
	e := s.due[0]
	at := e.due
	if !s.last.IsZero() {
		at = maxTime(at, s.last.Add(s.gap))
	}
	return e, at
}

// sent records that e's probe went out at now; it is in flight until
// answered or lost.
func (s *schedule) sent(e *entry, now time.Time) {
	heap.Remove(&s.due, e.index)
	s.last = now
	e.sentAt = now
	e.h.sent++
	e.h.last = now
}

// answered records the answer to k's probe in flight after rtt, at now,
// and reports whether k came back from Unreachable; false for a peer no
// longer probed or with no probe in flight.
func (s *schedule) answered(k Key, rtt time.Duration, now time.Time) (e *entry, back bool) {
	e = s.inFlight(k)
	if e == nil {
		return nil, false
	}
	back = e.h.answered(rtt, now)
	e.due = e.sentAt.Add(s.jittered(s.period()))
	heap.Push(&s.due, e)
	return e, back
}

// lost records that k's probe in flight went unanswered (or could not be
// sent), at now, and reports whether k just became Unreachable. Until it
// is, k is probed again at once (the rate permitting); after, once a
// period.
func (s *schedule) lost(k Key, now time.Time) (e *entry, down bool) {
	e = s.inFlight(k)
	if e == nil {
		return nil, false
	}
	down = e.h.lostOne(s.set.Threshold, now)
	if e.h.state == Unreachable {
		e.due = e.sentAt.Add(s.jittered(s.period()))
	} else {
		e.due = now
	}
	heap.Push(&s.due, e)
	return e, down
}

func (s *schedule) inFlight(k Key) *entry {
	e, ok := s.peers[k]
	if !ok || e.index >= 0 {
		return nil
	}
	return e
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// dueHeap orders entries by due time.
type dueHeap []*entry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
