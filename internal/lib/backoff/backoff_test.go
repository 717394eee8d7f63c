package backoff

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestTimeoutGrowsOnlyWhenAnAttemptRanOutOfTime(t *testing.T) {
	b := New(10*time.Second, 40*time.Second, time.Second, 4*time.Second)
	refused := errors.New("connection refused")
	b.Failed(refused)
	if got := b.Timeout(); got != 10*time.Second {
		t.Fatalf("after a refusal: timeout %v, want 10s unchanged", got)
	}
	for _, want := range []time.Duration{20 * time.Second, 40 * time.Second, 40 * time.Second} {
		b.Failed(fmt.Errorf("list leases: %w", context.DeadlineExceeded))
		if got := b.Timeout(); got != want {
			t.Fatalf("after running out of time: timeout %v, want %v", got, want)
		}
	}
}

func TestPauseDoublesWithJitterUpToItsMaximum(t *testing.T) {
	b := New(0, 0, time.Second, 4*time.Second)
	for i, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		got := b.Failed(errors.New("no leader"))
		if got < base/2 || got >= base*3/2 {
			t.Fatalf("pause %d = %v, want within [%v, %v)", i, got, base/2, base*3/2)
		}
	}
	if b.Timeout() != 0 {
		t.Fatalf("a step without a timeout got one: %v", b.Timeout())
	}
}

// Pauses of many hosts that failed together do not end together.
func TestPausesOfAFleetAreSpread(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[New(0, 0, time.Second, time.Second).Failed(errors.New("x")).Round(10*time.Millisecond)] = true
	}
	if len(seen) < 20 {
		t.Fatalf("100 hosts' first pauses fell on %d distinct 10 ms steps, want them spread over 1 s", len(seen))
	}
}
