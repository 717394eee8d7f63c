package peerhealth

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/overlaynet/overlay/backend"
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

// schedule decides which peer is probed when: each peer once a period, in
// random phase, with jitter, and retries after a loss, never two probes
// closer than 1/Rate. It is pure: every method is told the time.
//
// It holds thousands of peers for the daemon's whole life, so it keeps
// them small and free of pointers (see entry): one slice of records,
// found by key through an index of positions (index.go), queued by due
// time in a heap of positions. Its times are nanoseconds since base,
// turned back into time.Time only for reports.
type schedule struct {
	set Settings
	rnd *rand.Rand
	// base is what the times count from: the time of the first setPeers.
	base time.Time
	// peers are the records, in no order: a departing peer's place is
	// taken by the last one.
	peers []entry
	index peerIndex
	// due is a heap of positions in peers, the earliest due first; a peer
	// with a probe in flight is not in it.
	due []int32
	// last is when the last probe was sent (never before the first): the
	// next one goes no sooner than last + gap.
	last int64
	gap  time.Duration
	// mark is the parity of the current peer set: setPeers marks the
	// peers the new set names and drops the others.
	mark uint8
}

// never is a time that has not come: no probe sent yet.
const never = math.MinInt64

func newSchedule(set Settings, rnd *rand.Rand) *schedule {
	set.defaults()
	return &schedule{set: set, rnd: rnd, last: never, index: newPeerIndex(), gap: time.Duration(float64(time.Second) / set.Rate)}
}

// at is t in the schedule's time.
func (s *schedule) at(t time.Time) int64 { return int64(t.Sub(s.base)) }

// wall is the schedule's time ns as a time.Time (for the zero Time if
// never); it keeps base's monotonic clock reading.
func (s *schedule) wall(ns int64) time.Time {
	if ns == never {
		return time.Time{}
	}
	return s.base.Add(time.Duration(ns))
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

// lookup is k's record, nil if k is not probed. The pointer is good
// until the next setPeers.
func (s *schedule) lookup(k Key) *entry {
	if i := s.index.find(s.peers, packKey(k)); i >= 0 {
		return &s.peers[i]
	}
	return nil
}

// setPeers makes the peers of v4 and v6 the set probed (a family not
// probed is passed nil); their subnets are masked, a peer named twice
// takes the later public address. New ones are first probed at a random
// time within a period (so a cold start's thousands spread over the
// sweep), gone ones are forgotten (a probe in flight for one is ignored
// when it ends). Peers kept keep their record and schedule. The slices
// are read, not kept.
func (s *schedule) setPeers(now time.Time, v4, v6 []backend.Peer) {
	if s.base.IsZero() {
		s.base = now
	}
	t := s.at(now)
	if len(s.peers) == 0 {
		// The first set (a cold start's thousands): sized once rather
		// than grown entry by entry.
		n := len(v4) + len(v6)
		s.peers = slices.Grow(s.peers, n)
		s.index.reserve(s.peers, n)
	}
	// Mark the peers named, adding the new ones unscheduled (due never)
	// at the end...
	s.mark ^= 1
	added := 0
	for i, set := range [2][]backend.Peer{v4, v6} {
		fam := [2]backend.Family{backend.IPv4, backend.IPv6}[i]
		for _, pe := range set {
			k := packKey(Key{Family: fam, Subnet: pe.Subnet.Masked()})
			pub := packAddr(pe.PublicIP)
			if j := s.index.find(s.peers, k); j >= 0 {
				e := &s.peers[j]
				e.public, e.mark = pub, s.mark
				continue
			}
			s.peers = append(s.peers, entry{key: k, public: pub, since: t, last: never, due: never, index: -1, mark: s.mark})
			s.index.insert(s.peers, k, len(s.peers)-1)
			added++
		}
	}
	// ...drop the others (from the end down, so that the peer moved into
	// a departed one's place has been looked at)...
	for i := len(s.peers) - 1; i >= 0; i-- {
		if s.peers[i].mark != s.mark {
			s.remove(i)
		}
	}
	if added == 0 {
		return
	}
	// ...and schedule the new ones, with the period of the new set.
	p := s.period()
	bulk := added > len(s.due)
	if bulk {
		s.due = slices.Grow(s.due, added)
	}
	for i := range s.peers {
		e := &s.peers[i]
		if e.due != never {
			continue
		}
		e.due = t + int64(time.Duration(s.rnd.Float64()*float64(p)))
		if bulk {
			// More new peers than queued ones: queued all at once and
			// ordered in linear time (heapify), rather than pushed each.
			e.index = int32(len(s.due))
			s.due = append(s.due, int32(i))
		} else {
			s.push(i)
		}
	}
	if bulk {
		s.heapify()
	}
}

// remove forgets the peer at i: the last one takes its place.
func (s *schedule) remove(i int) {
	e := &s.peers[i]
	if e.index >= 0 {
		s.unqueue(int(e.index))
	}
	s.index.delete(s.peers, e.key)
	last := len(s.peers) - 1
	if i != last {
		s.index.move(s.peers, s.peers[last].key, i)
		s.peers[i] = s.peers[last]
		if h := s.peers[i].index; h >= 0 {
			s.due[h] = int32(i)
		}
	}
	s.peers = s.peers[:last]
}

// next is the peer whose probe is due first and when it may be sent (its
// due time or the rate's, whichever is later); nil if every peer has a
// probe in flight or there is none. The pointer is good until the next
// setPeers.
func (s *schedule) next() (*entry, time.Time) {
	if len(s.due) == 0 {
		return nil, time.Time{}
	}
	e := &s.peers[s.due[0]]
	at := e.due
	if s.last != never {
		at = max(at, s.last+int64(s.gap))
	}
	return e, s.wall(at)
}

// sent records that e's probe went out at now; it is in flight until
// answered or lost.
func (s *schedule) sent(e *entry, now time.Time) {
	s.unqueue(int(e.index))
	t := s.at(now)
	s.last = t
	e.last = t
	e.sent = inc(e.sent)
}

// answered records the answer to k's probe in flight after rtt, at now,
// and reports whether k came back from Unreachable; false for a peer no
// longer probed or with no probe in flight.
func (s *schedule) answered(k Key, rtt time.Duration, now time.Time) (e *entry, back bool) {
	i := s.inFlight(k)
	if i < 0 {
		return nil, false
	}
	e = &s.peers[i]
	back = e.answered(rtt, s.at(now))
	e.due = e.last + int64(s.jittered(s.period()))
	s.push(i)
	return e, back
}

// lost records that k's probe in flight went unanswered (or could not be
// sent), at now, and reports whether k just became Unreachable. Until it
// is, k is probed again at once (the rate permitting); after, once a
// period.
func (s *schedule) lost(k Key, now time.Time) (e *entry, down bool) {
	i := s.inFlight(k)
	if i < 0 {
		return nil, false
	}
	e = &s.peers[i]
	t := s.at(now)
	down = e.lostOne(s.set.Threshold, t)
	if e.state == Unreachable {
		e.due = e.last + int64(s.jittered(s.period()))
	} else {
		e.due = t
	}
	s.push(i)
	return e, down
}

// inFlight is the position of k's record if k has a probe in flight, else
// -1.
func (s *schedule) inFlight(k Key) int {
	i := s.index.find(s.peers, packKey(k))
	if i < 0 || s.peers[i].index >= 0 {
		return -1
	}
	return i
}

// The due heap: s.due holds positions in s.peers, each peer's index its
// place in s.due; the parent of place j is (j-1)/2 and due no later.

func (s *schedule) earlier(i, j int) bool { return s.peers[s.due[i]].due < s.peers[s.due[j]].due }

func (s *schedule) swap(i, j int) {
	s.due[i], s.due[j] = s.due[j], s.due[i]
	s.peers[s.due[i]].index, s.peers[s.due[j]].index = int32(i), int32(j)
}

// up moves the peer at place j towards the root while it is due earlier
// than its parent.
func (s *schedule) up(j int) {
	for j > 0 {
		parent := (j - 1) / 2
		if !s.earlier(j, parent) {
			return
		}
		s.swap(j, parent)
		j = parent
	}
}

// down moves the peer at place i below its children due earlier, within
// the first n places, and reports whether it moved.
func (s *schedule) down(i, n int) bool {
	from := i
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && s.earlier(r, child) {
			child = r
		}
		if !s.earlier(child, i) {
			break
		}
		s.swap(i, child)
		i = child
	}
	return i > from
}

// push queues the peer at position i by its due time.
func (s *schedule) push(i int) {
	s.peers[i].index = int32(len(s.due))
	s.due = append(s.due, int32(i))
	s.up(len(s.due) - 1)
}

// unqueue takes the peer at place h out of the heap.
func (s *schedule) unqueue(h int) {
	last := len(s.due) - 1
	if h != last {
		s.swap(h, last)
		if !s.down(h, last) {
			s.up(h)
		}
	}
	s.peers[s.due[last]].index = -1
	s.due = s.due[:last]
}

// heapify orders the whole heap, in linear time.
func (s *schedule) heapify() {
	n := len(s.due)
	for i := n/2 - 1; i >= 0; i-- {
		s.down(i, n)
	}
}
