package daemon

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/lib/backoff"
)

// A start-up step whose attempts run out of time gets longer attempts (a
// fleet restarting at once makes etcd slow; a fixed bound would throw every
// host's listing away again and again); one refused at once does not.
func TestStartupStepGivesSlowAttemptsMoreTime(t *testing.T) {
	s := stepper{log: slog.New(slog.DiscardHandler), st: &probe{}}
	var bounds []time.Duration
	attempt := func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		if !ok {
			return errors.New("attempt without a deadline")
		}
		bounds = append(bounds, time.Until(dl))
		switch len(bounds) {
		case 1, 2:
			return context.DeadlineExceeded // etcd too slow to answer in time
		case 3:
			return errors.New("connection refused")
		}
		return nil
	}
	b := backoff.New(10*time.Second, 40*time.Second, time.Millisecond, time.Millisecond)
	if err := s.run(t.Context(), "list the leases", b, attempt); err != nil {
		t.Fatal(err)
	}
	// Attempts 1–4 were bounded by 10, 20, 40 and 40 s.
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second}
	if len(bounds) != len(want) {
		t.Fatalf("%d attempts, want %d", len(bounds), len(want))
	}
	for i, w := range want {
		if bounds[i] > w || bounds[i] < w-5*time.Second {
			t.Errorf("attempt %d was bounded by %v, want about %v (all: %v)", i+1, bounds[i], w, bounds)
		}
	}
}
