package daemon

import (
	"net/netip"
	"slices"
	"time"
)

// What the log says about the VXLAN guard's refused sources. The guard
// keeps a source in its refused set for guard.RefusedTimeout (10 min)
// after its last datagram, so a stray sender that sends now and then (a
// misconfigured host's periodic traffic, a scanner coming back) leaves
// and re-enters the set all day; logging each entry into the set would
// repeat the same warning every few minutes for ever. An operator wants
// to hear of each source once, and to be reminded now and then that it
// is still at it, without a line per source per reminder.
//
// So: each source is logged (Warn, refusedMsg) the first time it is
// seen in this daemon's lifetime, and never again while it is
// remembered; at most refusedRemembered sources are (more only while
// more are in the guards' refused sets at once, which hold 2,048 at
// most), the ones seen longest ago forgotten first: a forgotten source
// that comes back is logged again. And once an hour at most
// (refusedRemind), if remembered sources sent again since they were last
// logged or reminded of, one line (refusedReminderMsg) says how many did,
// naming a few: a stray sender that keeps at it shows in every hour of
// the log, in one line whatever the number of sources.
const (
	// refusedRemembered bounds the sources remembered: twice what both
	// families' refused sets hold at once (guard.RefusedMax each), about
	// 400 kB at most.
	refusedRemembered = 4096
	// refusedRemind is the least time between two reminder lines.
	refusedRemind = time.Hour
	// refusedShown is how many sources a reminder line names.
	refusedShown = 8
)

// refusedReminderMsg is the reminder line (see refusedLog).
const refusedReminderMsg = "the VXLAN guard still drops datagrams to the VXLAN port from addresses no peer's lease publishes " +
	"(each was logged when first seen; `overlayd status` shows the current ones)"

// refusedLog decides which of the refused sources read at each check are
// logged (see the constants above). It is pure: the caller passes the
// time and logs what it returns. The daemon's loop alone uses it.
type refusedLog struct {
	max     int
	timeout time.Duration // the guard's: a source in its set sent within it
	// sources are the remembered sources: when each was logged as new
	// and last in a refused set.
	sources map[netip.Addr]refusedSource
	// reminded is when the last reminder was due: the first line's time
	// until the first reminder; zero before the first line.
	reminded time.Time
}

type refusedSource struct{ logged, seen time.Time }

func newRefusedLog(max int, timeout time.Duration) *refusedLog {
	return &refusedLog{max: max, timeout: timeout, sources: map[netip.Addr]refusedSource{}}
}

// note records the sources in the refused sets at now and returns those
// to log as new, in the order given.
func (r *refusedLog) note(now time.Time, sources []netip.Addr) (first []netip.Addr) {
	for _, a := range sources {
		s, ok := r.sources[a]
		if !ok {
			first = append(first, a)
			s.logged = now
		}
		s.seen = now
		r.sources[a] = s
	}
	if len(first) > 0 && r.reminded.IsZero() {
		r.reminded = now
	}
	if len(r.sources) > r.max {
		r.forget(now)
	}
	return first
}

// forget drops the sources seen longest ago, down to three quarters of
// max (so that a stream of new sources sorts seldom), never those seen
// at now.
func (r *refusedLog) forget(now time.Time) {
	type entry struct {
		a    netip.Addr
		seen time.Time
	}
	all := make([]entry, 0, len(r.sources))
	for a, s := range r.sources {
		all = append(all, entry{a, s.seen})
	}
	slices.SortFunc(all, func(x, y entry) int {
		if c := x.seen.Compare(y.seen); c != 0 {
			return c
		}
		return x.a.Compare(y.a)
	})
	for _, e := range all[:len(all)-r.max*3/4] {
		if !e.seen.Equal(now) {
			delete(r.sources, e.a)
		}
	}
}

// reminder returns, once remind has passed since the last reminder (or
// the first line), how many remembered sources sent again since they
// were last logged or reminded of, and the first few of them (sorted);
// ok is false when it is not time or there is nothing to say. A source
// sent again when it was in a refused set more than the guard's timeout
// after that: a datagram refreshed its entry since (one that merely had
// not expired yet does not count).
func (r *refusedLog) reminder(now time.Time, remind time.Duration, shown int) (count int, some []netip.Addr, ok bool) {
	if r.reminded.IsZero() || now.Sub(r.reminded) < remind {
		return 0, nil, false
	}
	var again []netip.Addr
	for a, s := range r.sources {
		since := s.logged
		if r.reminded.After(since) {
			since = r.reminded
		}
		if s.seen.Sub(since) > r.timeout {
			again = append(again, a)
		}
	}
	if len(again) == 0 {
		return 0, nil, false
	}
	slices.SortFunc(again, netip.Addr.Compare)
	r.reminded = now
	return len(again), again[:min(shown, len(again))], true
}
