package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend/guard"
)

// refusedRun drives a refusedLog as checkRefused does, every
// refusedCheckInterval from 0 to end, against a guard's refused set
// emulated from when each source sends (a source is in the set from its
// datagram until guard.RefusedTimeout after its last one). It returns the
// log lines: "first <addr> at <offset>" and "reminder <n> <addrs> at <offset>".
func refusedRun(l *refusedLog, sends func(at time.Duration) []netip.Addr, end time.Duration) []string {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	last := map[netip.Addr]time.Duration{}
	var lines []string
	for at := time.Duration(0); at <= end; at += refusedCheckInterval {
		for _, a := range sends(at) {
			last[a] = at
		}
		var set []netip.Addr
		for a, d := range last {
			if at-d < guard.RefusedTimeout {
				set = append(set, a)
			}
		}
		slices.SortFunc(set, netip.Addr.Compare)
		now := t0.Add(at)
		for _, a := range l.note(now, set) {
			lines = append(lines, fmt.Sprintf("first %s at %s", a, at))
		}
		if n, some, ok := l.reminder(now, refusedRemind, refusedShown); ok {
			lines = append(lines, fmt.Sprintf("reminder %d %v at %s", n, some, at))
		}
	}
	return lines
}

func TestRefusedSourcesAreLoggedOnceWithAnHourlyReminder(t *testing.T) {
	a, b := netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::9")
	every := func(period time.Duration, srcs ...netip.Addr) func(time.Duration) []netip.Addr {
		return func(at time.Duration) []netip.Addr {
			if at%period == 0 {
				return srcs
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name  string
		sends func(time.Duration) []netip.Addr
		end   time.Duration
		want  []string
	}{
		{"a steady sender: once, then a reminder an hour", every(refusedCheckInterval, a), 3*time.Hour + time.Minute, []string{
			"first 203.0.113.9 at 0s", "reminder 1 [203.0.113.9] at 1h0m0s", "reminder 1 [203.0.113.9] at 2h0m0s", "reminder 1 [203.0.113.9] at 3h0m0s"}},
		// Out of the guard's set 20 minutes of every 30: today's daemon
		// logged it every half hour.
		{"a sender back every 30 minutes: once, then a reminder an hour", every(30*time.Minute, a), 3*time.Hour + time.Minute, []string{
			"first 203.0.113.9 at 0s", "reminder 1 [203.0.113.9] at 1h0m0s", "reminder 1 [203.0.113.9] at 2h0m0s", "reminder 1 [203.0.113.9] at 3h0m0s"}},
		{"one datagram: once, no reminder", every(24*time.Hour, a), 5 * time.Hour, []string{"first 203.0.113.9 at 0s"}},
		{"back after 4 quiet hours: the reminder at once", func(at time.Duration) []netip.Addr {
			if at == 0 || at == 4*time.Hour+30*time.Minute {
				return []netip.Addr{a}
			}
			return nil
		}, 6 * time.Hour, []string{"first 203.0.113.9 at 0s", "reminder 1 [203.0.113.9] at 4h30m0s"}},
		{"two sources, one line for both", func(at time.Duration) []netip.Addr {
			switch {
			case at == 0:
				return []netip.Addr{a}
			case at == 10*time.Minute:
				return []netip.Addr{b}
			case at%(15*time.Minute) == 0:
				return []netip.Addr{a, b}
			}
			return nil
		}, 2*time.Hour + 20*time.Minute, []string{
			"first 203.0.113.9 at 0s", "first 2001:db8::9 at 10m0s", "reminder 2 [203.0.113.9 2001:db8::9] at 1h0m0s", "reminder 2 [203.0.113.9 2001:db8::9] at 2h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := refusedRun(newRefusedLog(refusedRemembered, guard.RefusedTimeout), tc.sends, tc.end)
			if !slices.Equal(got, tc.want) {
				t.Errorf("log lines:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// A stream of new sources (a scan from many addresses) keeps the memory
// bounded; a source that keeps sending is never forgotten, so never
// logged twice; one forgotten while quiet is logged again when it
// comes back.
func TestRefusedLogMemoryIsBounded(t *testing.T) {
	const max = 1000 // above the ~420 sources in the emulated set at once, as refusedRemembered is above the guard's sets
	steady, early := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	next := netip.MustParseAddr("10.0.0.0")
	l := newRefusedLog(max, guard.RefusedTimeout)
	lines := refusedRun(l, func(at time.Duration) []netip.Addr {
		out := []netip.Addr{steady}
		if at == 0 {
			out = append(out, early)
		}
		if at == 6*time.Hour {
			return append(out, early)
		}
		for range 7 { // 7 new sources a check, 2,520 an hour
			next = next.Next()
			out = append(out, next)
		}
		return out
	}, 6*time.Hour)
	if len(l.sources) > max {
		t.Errorf("%d sources remembered, want at most %d", len(l.sources), max)
	}
	count := func(prefix string) int {
		n := 0
		for _, s := range lines {
			if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
				n++
			}
		}
		return n
	}
	if n := count("first " + steady.String() + " "); n != 1 {
		t.Errorf("the steady source was logged as new %d times, want 1", n)
	}
	if n := count("first " + early.String() + " "); n != 2 {
		t.Errorf("the source forgotten while quiet was logged %d times, want 2 (at 0 and on its return)", n)
	}
	if n := count("reminder "); n != 6 {
		t.Errorf("%d reminders in 6 hours, want 6", n)
	}
}
