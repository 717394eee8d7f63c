// Package fakesource is an in-memory subnet.Source, for tests of the
// daemon that need no store: the test gives it the network config, this
// host's subnets and the lease set Acquire returns, then feeds the watch
// batch by batch (Send) and reads back what the daemon did with it (the
// host it published, whether Keep runs, whether it was closed). It keeps
// the contract of subnet.Source where the daemon relies on it: Keep,
// Watch and WatchConfig run until their context ends, the channels close
// then, Held is nil before Claim.
package fakesource

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/overlaynet/overlay/subnet"
)

// ErrFatal is the error IsFatal says retrying cannot fix (and any error
// wrapping it).
var ErrFatal = errors.New("fakesource: fatal")

// Source is an in-memory lease source. Its zero value is not usable: see
// New.
type Source struct {
	// ConnectErr, if set before the daemon starts, is what Connect fails
	// with.
	ConnectErr error

	cfg     *subnet.Config
	own     subnet.Subnets
	snap    subnet.Snapshot
	batches chan subnet.Batch
	lost    chan error
	keeping chan struct{} // closed when Keep starts

	mu       sync.Mutex
	host     subnet.Host
	claimed  bool
	acquired bool
	watches  int // Watch calls still running
	closed   int
	released int
}

// New returns a source of the network cfg that gives this host the lease
// on own and starts the watch from snap (its Behind set: a saved set the
// watch has to catch up with, by a batch with CaughtUp).
func New(cfg *subnet.Config, own subnet.Subnets, snap subnet.Snapshot) *Source {
	return &Source{cfg: cfg, own: own, snap: snap, batches: make(chan subnet.Batch), lost: make(chan error, 1), keeping: make(chan struct{})}
}

// Send hands b to the running watch; it fails if ctx ends first.
func (s *Source) Send(ctx context.Context, b subnet.Batch) error {
	select {
	case s.batches <- b:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Lose makes Keep return err: the lease is lost for good.
func (s *Source) Lose(err error) { s.lost <- err }

// Keeping is closed once Keep runs.
func (s *Source) Keeping() <-chan struct{} { return s.keeping }

// Host is the host Claim was given (what the daemon publishes).
func (s *Source) Host() subnet.Host {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.host
}

// Closed is how many times Close was called; Released how many times
// Release gave a lease up; Watching how many watches still run.
func (s *Source) Closed() int   { s.mu.Lock(); defer s.mu.Unlock(); return s.closed }
func (s *Source) Released() int { s.mu.Lock(); defer s.mu.Unlock(); return s.released }
func (s *Source) Watching() int { s.mu.Lock(); defer s.mu.Unlock(); return s.watches }

// Where names the fake store.
func (s *Source) Where() string { return "the fake source" }

// Connect fails with ConnectErr, if set.
func (s *Source) Connect(context.Context) error { return s.ConnectErr }

// Name is "fake": readiness's condition of the host's liveness.
func (s *Source) Name() string { return "fake" }

// Config returns the network config New was given.
func (s *Source) Config(context.Context) (*subnet.Config, error) { return s.cfg, nil }

// ConfigKey names the fake config.
func (s *Source) ConfigKey() string { return "fake/config" }

// LeaseName names a lease "fake/<subnets' key>".
func (s *Source) LeaseName(sn subnet.Subnets) string { return "fake/" + sn.Key() }

// Claim records host.
func (s *Source) Claim(_ context.Context, _ *subnet.Config, host subnet.Host, _ func(string)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.host, s.claimed = host, true
	return nil
}

// Acquire returns the lease on own, with the claimed host's value, and
// the snapshot New was given.
func (s *Source) Acquire(context.Context) (subnet.Lease, subnet.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimed {
		return subnet.Lease{}, subnet.Snapshot{}, errors.New("fakesource: Acquire before Claim")
	}
	s.acquired = true
	return s.lease(), s.snap, nil
}

// lease is the lease on own with the host's value. s.mu is held.
func (s *Source) lease() subnet.Lease {
	return subnet.Lease{Subnet: s.own.IPv4, IPv6Subnet: s.own.IPv6, Attrs: s.host.Attrs}
}

// Keep runs until ctx ends (nil) or Lose is called (its error).
func (s *Source) Keep(ctx context.Context) error {
	close(s.keeping)
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.lost:
		return err
	}
}

// Watch delivers what Send is given until ctx ends; then the channel
// closes.
func (s *Source) Watch(ctx context.Context, _ subnet.Snapshot, _ subnet.WatchOptions) <-chan subnet.Batch {
	out := make(chan subnet.Batch)
	s.mu.Lock()
	s.watches++
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			s.watches--
			s.mu.Unlock()
			close(out)
		}()
		for {
			select {
			case b := <-s.batches:
				select {
				case out <- b:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// WatchConfig delivers the config New was given, then nothing, until ctx
// ends; then the channel closes.
func (s *Source) WatchConfig(ctx context.Context) <-chan subnet.ConfigUpdate {
	out := make(chan subnet.ConfigUpdate)
	go func() {
		defer close(out)
		select {
		case out <- subnet.ConfigUpdate{Config: s.cfg}:
		case <-ctx.Done():
			return
		}
		<-ctx.Done()
	}()
	return out
}

// Held is the lease as held: never expiring within the test, alive;
// nil before Claim.
func (s *Source) Held() subnet.LeaseState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimed {
		return nil
	}
	return held{s}
}

type held struct{ s *Source }

func (h held) Lease() subnet.Lease {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.lease()
}
func (h held) Expires() time.Time      { return time.Now().Add(time.Hour) }
func (h held) KeyProblem() error       { return nil }
func (h held) Liveness() (bool, error) { return true, nil }

// Release gives up the lease if Acquire made one.
func (s *Source) Release(context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.acquired {
		return false, nil
	}
	s.acquired = false
	s.released++
	return true, nil
}

// IsFatal reports whether err is (or wraps) ErrFatal.
func (s *Source) IsFatal(err error) bool { return errors.Is(err, ErrFatal) }

// Close counts the call.
func (s *Source) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed++
}

var _ subnet.Source = (*Source)(nil)
