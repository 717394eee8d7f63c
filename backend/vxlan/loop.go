package vxlan

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/overlaynet/overlay/internal/lib/jitter"
)

// Run implements backend.Plane: it runs a pass at once and then whenever
// SetPeers changes the desired state, the kernel notifies a change to our
// device, routes or neighbours, a failed pass is due for retry (exponential
// backoff), or the jittered resync interval has passed without a pass. Run
// returns nil when ctx is cancelled, after its goroutines have exited.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("vxlan: Run called while already running")
	}
	defer b.running.Store(false)

	sub := subscription{b: b}
	defer sub.stop()

	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var resync *time.Timer
	var resyncC <-chan time.Time
	if b.cfg.ResyncInterval > 0 {
		resync = time.NewTimer(b.cfg.ResyncInterval)
		defer resync.Stop()
		resyncC = resync.C
	}
	backoff := b.cfg.RetryMin
	onlyPeers := false // woken only because the desired peers changed
	for {
		// Subscribe before listing, so no change between the listing and
		// the subscription goes unseen.
		sub.start()
		full, err := b.pass(onlyPeers)
		if errors.Is(err, errTornDown) {
			<-ctx.Done()
			return nil
		}
		notifyC := b.notify
		if err != nil {
			retry.Reset(backoff)
			backoff = min(backoff*2, b.cfg.RetryMax)
			// While failing, kernel notifications (often our own partial
			// writes) wait for the retry timer instead of bypassing backoff.
			notifyC = nil
		} else {
			retry.Stop()
			backoff = b.cfg.RetryMin
		}
		if resync != nil && full {
			resync.Reset(jitter.Spread(b.cfg.ResyncInterval))
		}
		onlyPeers = false
		select {
		case <-ctx.Done():
			return nil
		case <-b.kick:
			onlyPeers = true
		case <-notifyC:
		case <-retry.C:
		case <-resyncC:
		case <-sub.ended:
			b.log.Warn("kernel notifications stopped (socket overflow?); resubscribing and relisting")
			sub.stop()
		}
	}
}

// subscription is Run's subscription to kernel notifications, which feed
// onEvent; ended closes if the kernel stops delivering them.
type subscription struct {
	b      *Backend
	done   chan struct{}
	ended  <-chan struct{}
	warned bool // the failure to subscribe was logged
}

// start subscribes unless subscribed (or disabled); a failure is logged
// once and retried at the next call.
func (s *subscription) start() {
	if s.b.cfg.DisableWatch || s.done != nil {
		return
	}
	done := make(chan struct{})
	ended, err := s.b.nl.Subscribe(done, s.b.onEvent)
	if err != nil {
		if !s.warned {
			s.b.log.Warn("cannot subscribe to kernel notifications; relying on periodic resync until it works", "err", err)
			s.warned = true
		}
		return
	}
	s.warned = false
	s.done, s.ended = done, ended
}

// stop ends the subscription and waits for its goroutine.
func (s *subscription) stop() {
	if s.done != nil {
		close(s.done)
		<-s.ended
		s.done, s.ended = nil, nil
	}
}

// onEvent filters kernel notifications down to the ones that may mean our
// state was disturbed; it runs on the subscription goroutine. A deleted
// route, neighbour or FDB entry matters only if a desired peer needs it:
// the deletions of our own passes (a peer removed, an old MAC dropped)
// must not wake a full pass each.
func (b *Backend) onEvent(e Event) {
	dev := b.devIndex.Load()
	switch e.Kind {
	case EventLink:
		if e.LinkName == b.name || int64(e.LinkIndex) == dev || int64(e.LinkIndex) == b.underlayIndex.Load() {
			poke(b.notify)
		}
	case EventRouteDel:
		if e.Protocol == RouteProtocol && b.ofOurFamily(e.Dst.Addr()) && b.wants(e) {
			poke(b.notify)
		}
	case EventNeighDel:
		if int64(e.LinkIndex) == dev && (e.FDB || b.ofOurFamily(e.IP)) && b.wants(e) {
			poke(b.notify)
		}
	}
}

// ofOurFamily reports whether a deleted entry's address may be of our
// family (true when unknown): the other family's overlay, the twin of ours
// on a dual-stack host, deletes its own entries, and the kernel deletes its
// own neighbours of the other family on our device.
func (b *Backend) ofOurFamily(a netip.Addr) bool {
	return !a.IsValid() || familyOf(a) == b.cfg.fam
}

// wants reports whether a deleted entry may be one a desired peer needs
// (true when the notification does not say which entry it was).
func (b *Backend) wants(e Event) bool {
	w := b.wanted.Load()
	if w == nil {
		return false // no peers desired: nothing to repair
	}
	switch {
	case e.Kind == EventRouteDel && e.Dst.IsValid():
		return w.hasSubnet(e.Dst)
	case e.Kind == EventNeighDel && e.FDB && !e.MAC.IsZero():
		return w.hasMAC(e.MAC)
	case e.Kind == EventNeighDel && !e.FDB && e.IP.IsValid():
		return w.hasHop(e.IP)
	}
	return true
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
