package etcdv3

import (
	"log/slog"
	"time"

	"github.com/overlaynet/overlay/internal/lib/backoff"
)

// WarnEvery is how often a failure that keeps repeating is logged again
// (backoff.WarnEvery, which the daemon's start-up steps use too).
const WarnEvery = backoff.WarnEvery

// repeatWarn logs the warnings of one retry loop: the first at once, then
// at most one every WarnEvery, each with the number of failures so far;
// the failures between them at debug.
type repeatWarn struct {
	last     time.Time
	failures int
}

func (r *repeatWarn) warn(log *slog.Logger, msg string, args ...any) {
	r.failures++
	args = append(args, "failures", r.failures)
	if !r.last.IsZero() && time.Since(r.last) < WarnEvery {
		log.Debug(msg, args...)
		return
	}
	r.last = time.Now()
	log.Warn(msg, args...)
}

// recovered ends a run of failures, saying so if more than one was seen.
func (r *repeatWarn) recovered(log *slog.Logger, msg string, args ...any) {
	if r.failures > 1 {
		log.Info(msg, append(args, "failures", r.failures)...)
	}
	*r = repeatWarn{}
}
