package vxlan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/lib/jitter"
)

// Peer is backend.Peer, repeated here for convenience.
type Peer = backend.Peer

// maxDumpAttempts bounds how often one listing is retried when the kernel
// reports it interrupted by a concurrent change.
const maxDumpAttempts = 5

// Backend is the VXLAN data plane. Create it with New, call EnsureDevice to
// learn the VTEP MAC and MTU to publish, then run Run in a goroutine and feed
// it peer sets with SetPeers.
//
// One goroutine at a time owns the kernel: Run's loop, or a caller of
// EnsureDevice, Reconcile or Teardown (they serialise on a mutex).
type Backend struct {
	cfg  Config
	nl   Netlink
	log  *slog.Logger
	name string
	mac  MAC

	kick    chan struct{} // SetPeers: the desired state changed
	notify  chan struct{} // the kernel changed under us
	running atomic.Bool

	// Indexes the event filter compares against; written under opMu.
	devIndex      atomic.Int64
	underlayIndex atomic.Int64

	// wanted indexes the desired peers' entries for the notification
	// filter (onEvent runs on the subscription's goroutine).
	wanted atomic.Pointer[peerIndex]

	mu      sync.Mutex // guards the fields below
	desired []Peer
	gen     uint64 // bumped by every SetPeers
	invalid map[string]string
	status  backend.Status // published by the kernel owner
	doneGen uint64         // generation the last finished pass worked on

	opMu      sync.Mutex // held by whoever touches the kernel; guards the fields below
	devSeen   bool       // we have seen our device since we started
	tornDown  bool
	syncedGen uint64 // generation of the last fully successful pass
	synced    bool   // some pass fully succeeded
	failing   bool   // the last pass failed (for quiet logs)
	// programmed are the peers whose current lease is fully in the kernel,
	// sorted by subnet; usually the desired set itself (shared, not
	// copied: desired slices are never modified).
	programmed []Peer
	conflicted map[netip.Prefix]bool // conflicts already logged
	stats      counters

	// What the last successful pass left in the kernel, for the next pass
	// to start from when only the desired peers changed (see pass):
	// inKernel are its peers, fully programmed unless conflicted, with
	// nothing else of ours on the device; env the devices it worked on;
	// out what its listing (the last full one) showed of other routes.
	inKernel []Peer
	inSync   bool
	env      diffEnv
	out      outside
}

type counters struct {
	Passes, Errors, Writes, okWrites, DriftRepairs, DeviceRecreations uint64
}

var _ backend.Backend = (*Backend)(nil)

// New returns a Backend that programs the kernel through nl. It checks the
// configuration but touches nothing; EnsureDevice, Reconcile or Run do.
func New(cfg Config, nl Netlink) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if nl == nil {
		return nil, errors.New("vxlan: nil Netlink")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	name := DeviceName(cfg.VNI)
	b := &Backend{
		cfg:        cfg,
		nl:         nl,
		log:        log.With("component", "vxlan", "device", name),
		name:       name,
		kick:       make(chan struct{}, 1),
		notify:     make(chan struct{}, 1),
		conflicted: make(map[netip.Prefix]bool),
	}
	b.mac, _ = backend.MACFrom(VtepMAC(cfg.NodeID, cfg.VNI))
	b.devIndex.Store(-1)
	b.underlayIndex.Store(-1)
	b.status.Device = name
	b.status.VtepMAC = b.mac.HardwareAddr()
	return b, nil
}

// DeviceInfo describes the overlay device after EnsureDevice.
type DeviceInfo struct {
	Name    string
	Index   int
	VtepMAC net.HardwareAddr // publish in the lease (BackendData.VtepMAC)
	MTU     int              // hand to pods (OVERLAY_MTU)
}

// EnsureDevice creates the overlay device or adopts the existing one,
// fixing in place what differs and recreating it if its identity differs.
// On a matching device it performs no writes. Run does the same at every
// pass; the daemon calls this first to learn the MAC and MTU to publish.
func (b *Backend) EnsureDevice(ctx context.Context) (DeviceInfo, error) {
	if err := ctx.Err(); err != nil {
		return DeviceInfo{}, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if b.tornDown {
		return DeviceInfo{}, errTornDown
	}
	dev, underlay, created, err := b.ensureDevice()
	b.noteDevice(dev, underlay, err)
	if created || err != nil {
		b.inSync = false // the next pass lists the kernel
	}
	b.publish(func(s *backend.Status) {})
	if err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{Name: dev.Name, Index: dev.Index, VtepMAC: dev.MAC.HardwareAddr(), MTU: dev.MTU}, nil
}

var errTornDown = errors.New("vxlan: backend was torn down")

func (b *Backend) noteDevice(dev, underlay Link, err error) {
	if err != nil {
		b.devIndex.Store(-1)
		b.mu.Lock()
		b.status.DevicePresent = false
		b.mu.Unlock()
		return
	}
	b.devIndex.Store(int64(dev.Index))
	b.underlayIndex.Store(int64(underlay.Index))
	b.mu.Lock()
	b.status.DevicePresent = true
	b.status.MTU = dev.MTU
	b.mu.Unlock()
}

// SetPeers implements backend.Backend. Invalid peers (non-IPv4, bad MAC,
// overlapping our lease, duplicates) are dropped, logged once and counted
// in Status.InvalidPeers. A set equal to the current one (in any order) is
// a no-op.
func (b *Backend) SetPeers(peers []Peer) {
	specs, rejected, idx := validatePeers(peers, b.cfg.OwnSubnet, b.cfg.LocalIP)
	b.mu.Lock()
	if slices.Equal(specs, b.desired) && maps.Equal(rejected, b.invalid) {
		b.mu.Unlock()
		return // nothing changed: no pass needed
	}
	b.wanted.Store(&idx)
	for k, why := range rejected {
		if b.invalid[k] != why {
			b.log.Warn("ignoring invalid peer", "peer", k, "reason", why)
		}
	}
	b.invalid = rejected
	b.desired = specs
	b.gen++
	b.mu.Unlock()
	poke(b.kick)
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Status implements backend.Backend.
func (b *Backend) Status() backend.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.status
	s.VtepMAC = slices.Clone(s.VtepMAC)
	s.Peers = len(b.desired)
	s.InvalidPeers = len(b.invalid)
	s.Pending = b.gen != b.doneGen
	return s
}

// publish copies the counters into the status under mu, with f for the rest.
// Callers hold opMu.
func (b *Backend) publish(f func(s *backend.Status)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &b.status
	s.Passes, s.Errors, s.Writes = b.stats.Passes, b.stats.Errors, b.stats.Writes
	s.DriftRepairs, s.DeviceRecreations = b.stats.DriftRepairs, b.stats.DeviceRecreations
	f(s)
}

// Run implements backend.Backend: it runs a pass at once and then whenever
// SetPeers changes the desired state, the kernel notifies a change to our
// device, routes or neighbours, a failed pass is due for retry (exponential
// backoff), or the jittered resync interval has passed without a pass. Run
// returns nil when ctx is cancelled, after its goroutines have exited.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("vxlan: Run called while already running")
	}
	defer b.running.Store(false)

	var (
		subDone  chan struct{}
		subEnded <-chan struct{}
		subWarn  bool
	)
	stopWatch := func() {
		if subDone != nil {
			close(subDone)
			<-subEnded
			subDone, subEnded = nil, nil
		}
	}
	defer stopWatch()
	startWatch := func() {
		if b.cfg.DisableWatch || subDone != nil {
			return
		}
		done := make(chan struct{})
		ended, err := b.nl.Subscribe(done, b.onEvent)
		if err != nil {
			if !subWarn {
				b.log.Warn("cannot subscribe to kernel notifications; relying on periodic resync until it works", "err", err)
				subWarn = true
			}
			return
		}
		subWarn = false
		subDone, subEnded = done, ended
	}

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
		startWatch()
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
		case <-subEnded:
			b.log.Warn("kernel notifications stopped (socket overflow?); resubscribing and relisting")
			close(subDone)
			subDone, subEnded = nil, nil
		}
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
		if e.Protocol == RouteProtocol && b.wants(e) {
			poke(b.notify)
		}
	case EventNeighDel:
		if int64(e.LinkIndex) == dev && b.wants(e) {
			poke(b.notify)
		}
	}
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

// Reconcile runs one pass now, synchronously: it is what Run does on every
// wake-up. Useful for tools and tests; safe while Run runs.
func (b *Backend) Reconcile(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := b.pass(false)
	return err
}

func retryDump[T any](list func() ([]T, error)) ([]T, error) {
	var err error
	for range maxDumpAttempts {
		var out []T
		out, err = list()
		if err == nil {
			return out, nil
		}
		if !isInterrupted(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("listing interrupted %d times in a row by concurrent changes: %w", maxDumpAttempts, err)
}

func (b *Backend) readKernel(dev int) (kernelState, error) {
	var s kernelState
	var err error
	if s.Routes, err = retryDump(b.nl.RouteList); err != nil {
		return s, fmt.Errorf("list routes: %w", err)
	}
	if s.Neighs, err = retryDump(func() ([]Neigh, error) { return b.nl.NeighList(dev) }); err != nil {
		return s, fmt.Errorf("list neighbours of %s: %w", b.name, err)
	}
	if s.FDBs, err = retryDump(func() ([]FDB, error) { return b.nl.FDBList(dev) }); err != nil {
		return s, fmt.Errorf("list FDB of %s: %w", b.name, err)
	}
	return s, nil
}

// write runs one kernel write, counting it.
func (b *Backend) write(f func() error) error {
	b.stats.Writes++
	err := f()
	if err == nil {
		b.stats.okWrites++
	}
	return err
}

// WriteError is the error of a pass in which some kernel writes failed. The
// pass still applied every write it could.
type WriteError struct {
	Failed  int   // writes that failed
	Skipped int   // writes not tried because an earlier write for the same peer failed
	Total   int   // writes the pass planned
	First   error // the first failure, naming the write
}

func (e *WriteError) Error() string {
	s := fmt.Sprintf("%d of %d kernel writes failed", e.Failed, e.Total)
	if e.Skipped > 0 {
		s += fmt.Sprintf(" (%d more skipped)", e.Skipped)
	}
	return s + "; first: " + e.First.Error()
}

func (e *WriteError) Unwrap() error { return e.First }

// exec runs one write as a batch of one.
func (b *Backend) exec(o op) error {
	return b.count(o, b.nl.Write([]Write{o.request()})[0])
}

// count records the outcome of one write: already gone is what a deletion
// wanted.
func (b *Backend) count(o op, err error) error {
	b.stats.Writes++
	if err != nil && o.kind.isDelete() && isNotFound(err) {
		err = nil
	}
	if err == nil {
		b.stats.okWrites++
	}
	return err
}

// applyChunk is how many writes apply builds and hands to Netlink.Write at
// a time.
const applyChunk = 128

type applyResult struct {
	err     *WriteError
	failed  map[netip.Prefix]bool // desired peers with a failed or skipped write
	touched map[netip.Prefix]bool // desired peers with a successful write
	removed []Route               // stale routes removed
}

func (r *applyResult) record(o op, err error, total int) {
	if err != nil {
		if r.err == nil {
			r.err = &WriteError{Total: total, First: fmt.Errorf("%v: %w", o, err)}
		}
		r.err.Failed++
		if o.peer.IsValid() {
			if r.failed == nil {
				r.failed = make(map[netip.Prefix]bool)
			}
			r.failed[o.peer] = true
		}
		return
	}
	if o.peer.IsValid() {
		if r.touched == nil {
			r.touched = make(map[netip.Prefix]bool)
		}
		r.touched[o.peer] = true
	} else if o.kind == opRouteDel {
		r.removed = append(r.removed, o.route)
	}
}

// apply runs the plan in order. A failed write does not stop the pass (one
// bad peer must not hold up the others) but skips the rest of that peer's
// writes, so a route never goes in without its neighbour and FDB entry.
//
// The plan's writes come by kind (all neighbours, then all FDB entries,
// then all routes...). The writes of one kind concern distinct peers, so
// none depends on another's outcome: Netlink.Write gets them applyChunk at
// a time, and the next kind only starts once the outcome of every write of
// this one is known, which keeps the skipping exact. The prune kinds,
// which may hold several writes for one peer, go one by one.
func (b *Backend) apply(p *plan) applyResult {
	var r applyResult
	total := 0
	for k := range numOpKinds {
		total += p.count(k)
	}
	chunk := make([]op, 0, applyChunk)
	reqs := make([]Write, 0, applyChunk)
	for k := range numOpKinds {
		n := p.count(k)
		if n < 2 || k == opFDBPrune || k == opRoutePrune {
			for i := range n {
				o := p.at(k, i)
				if o.peer.IsValid() && r.failed[o.peer] {
					r.err.Skipped++
					continue
				}
				r.record(o, b.exec(o), total)
			}
			continue
		}
		for start := 0; start < n; start += applyChunk {
			chunk = chunk[:0]
			for i := start; i < min(n, start+applyChunk); i++ {
				o := p.at(k, i)
				if o.peer.IsValid() && r.failed[o.peer] {
					r.err.Skipped++
					continue
				}
				chunk = append(chunk, o)
			}
			reqs = reqs[:0]
			for _, o := range chunk {
				reqs = append(reqs, o.request())
			}
			for i, err := range b.nl.Write(reqs) {
				r.record(chunk[i], b.count(chunk[i], err), total)
			}
		}
	}
	return r
}

// pass is one reconcile pass: ensure the device, find out what the kernel
// holds, diff against the desired peers and apply the delta. It reports
// whether it read the kernel back (a full pass).
//
// A full pass lists the kernel once per kind. When onlyPeers is set — the
// pass was woken by SetPeers alone — and the previous pass succeeded on the
// same devices, the kernel holds what that pass left, except for changes
// the notifications would have reported (deletions of wanted entries, link
// changes: they wake a full pass instead) or that only a listing finds
// (silent drift: the periodic resync, a full pass, finds it). Such a pass
// lists nothing: it diffs the changed peers against the entries the last
// pass left for them. A lease event then costs its own writes, not a
// listing of every peer's entries; a peer whose subnet is held by another
// program's route, or a device that had to be recreated, still gets a
// full pass.
func (b *Backend) pass(onlyPeers bool) (full bool, err error) {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	if b.tornDown {
		return true, errTornDown
	}
	start := time.Now()
	b.mu.Lock()
	want, gen := b.desired, b.gen
	b.mu.Unlock()
	b.stats.Passes++
	okBefore := b.stats.okWrites

	// A pass woken by SetPeers alone after a successful one starts from
	// what that pass left, devices included: a change to them (deleted,
	// down, new MTU) is notified and wakes a full pass, which checks them.
	var p plan
	var env diffEnv
	full = true
	if onlyPeers && b.inSync {
		gone, come := specDelta(b.inKernel, want)
		if !anyIn(b.conflicted, gone, come) {
			full, env = false, b.env
			p = diff(come, believed(gone, come, env, b.out), env)
		}
	}
	created := false
	if full {
		dev, underlay, c, err := b.ensureDevice()
		b.noteDevice(dev, underlay, err)
		if err != nil {
			b.inSync = false
			return true, b.finish(start, gen, want, err, nil, nil)
		}
		env = diffEnv{Dev: dev.Index, Underlay: underlay.Index, DirectRouting: b.cfg.DirectRouting}
		created = c
		have, err := b.readKernel(env.Dev)
		if err != nil {
			b.inSync = false
			return true, b.finish(start, gen, want, err, nil, nil)
		}
		b.out = outsideOf(have.Routes, env)
		p = diff(want, have, env)
	}
	res := b.apply(&p)

	// Writes in a pass whose desired state had already been applied in
	// full are repairs of drift: someone or something changed the kernel.
	if repaired := b.stats.okWrites - okBefore; repaired > 0 && !created && b.synced && gen == b.syncedGen {
		b.stats.DriftRepairs += repaired
		b.log.Info("repaired drift in kernel state", "entries", repaired)
	}
	if len(res.removed) > logEach {
		b.log.Info("peers removed", "removed", len(res.removed))
	}
	if b.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, r := range res.removed {
			b.log.Debug("peer removed from the kernel", "peer", r.Dst, "via", r.Gw)
		}
	}
	conflicts := b.conflicted
	if full {
		conflicts = make(map[netip.Prefix]bool, len(p.conflicts))
	} else if len(p.conflicts) > 0 {
		conflicts = maps.Clone(b.conflicted)
	}
	for _, c := range p.conflicts {
		conflicts[c] = true
		if !b.conflicted[c] {
			b.log.Warn("another program's route holds a peer's subnet; not overwriting it, the peer is unreachable until it is removed",
				"peer", c)
		}
	}
	b.conflicted = conflicts

	var werr error
	if res.err != nil {
		werr = res.err
	}
	b.inSync, b.inKernel, b.env = werr == nil, want, env
	return full, b.finish(start, gen, want, werr, &res, conflicts)
}

// logEach is how many peers one pass may add, update or remove without a
// summary line at Info; each peer is logged at Debug only (the daemon logs
// each lease event at Info once, so the backend does not repeat it).
const logEach = 16

// anyIn reports whether a peer of either set has its subnet in conflicted:
// what the kernel holds for it is another program's business, which only a
// listing tells.
func anyIn(conflicted map[netip.Prefix]bool, sets ...[]Peer) bool {
	for _, set := range sets {
		for _, s := range set {
			if conflicted[s.Subnet] {
				return true
			}
		}
	}
	return false
}

// finish records the outcome of a pass: the peers now programmed (calling
// the hook and logging each change), status and counters, quiet logs.
func (b *Backend) finish(start time.Time, gen uint64, want []Peer, err error, res *applyResult, conflicts map[netip.Prefix]bool) error {
	now := time.Now()
	programmed, adopted := 0, 0
	if res != nil {
		var added, updated []Peer
		var replaced []Peer // the previous versions of updated
		// Walk want and the previously programmed peers (both sorted) side
		// by side. A peer that failed or is in conflict keeps its previous
		// version, if any; the new set is want itself unless one did.
		old := b.programmed
		var next []Peer // nil while it equals want[:programmed]
		j := 0
		for i, w := range want {
			for j < len(old) && prefixKey(old[j].Subnet) < prefixKey(w.Subnet) {
				j++
			}
			prev, had := Peer{}, j < len(old) && old[j].Subnet == w.Subnet
			if had {
				prev = old[j]
			}
			if res.failed[w.Subnet] || conflicts[w.Subnet] {
				if next == nil {
					next = append(make([]Peer, 0, len(want)), want[:i]...)
				}
				if had {
					next = append(next, prev)
				}
				continue
			}
			programmed++
			if next != nil {
				next = append(next, w)
			}
			if had && prev == w {
				continue
			}
			switch {
			case !res.touched[w.Subnet]:
				adopted++ // found in place
			case had:
				updated, replaced = append(updated, w), append(replaced, prev)
			default:
				added = append(added, w)
			}
			if f := b.cfg.OnPeerProgrammed; f != nil {
				f(w, now)
			}
		}
		if next == nil {
			next = want
		}
		b.programmed = next
		if len(added)+len(updated) > logEach {
			b.log.Info("peers programmed", "added", len(added), "updated", len(updated))
		}
		if b.log.Enabled(context.Background(), slog.LevelDebug) {
			for i, w := range updated {
				b.log.Debug("peer updated in the kernel", "peer", w.Subnet, "public_ip", w.PublicIP, "vtep_mac", w.VtepMAC.String(),
					"old_public_ip", replaced[i].PublicIP, "old_vtep_mac", replaced[i].VtepMAC.String())
			}
			for _, w := range added {
				b.log.Debug("peer programmed in the kernel", "peer", w.Subnet, "public_ip", w.PublicIP, "vtep_mac", w.VtepMAC.String())
			}
		}
		if adopted > 0 {
			b.log.Info("adopted peers already programmed in the kernel", "peers", adopted)
		}
	}

	if err != nil {
		b.stats.Errors++
		if !b.failing {
			b.log.Warn("reconcile pass failed; retrying with backoff", "err", err)
		} else {
			b.log.Debug("reconcile pass failed again", "err", err)
		}
		b.failing = true
	} else {
		if b.failing {
			b.log.Info("back in sync", "peers", len(want))
		} else if !b.synced {
			b.log.Info("in sync", "peers", len(want), "writes", b.stats.Writes)
		}
		b.failing = false
		b.synced = true
		b.syncedGen = gen
	}
	b.publish(func(s *backend.Status) {
		b.doneGen = gen
		s.PeersProgrammed = programmed
		s.Conflicts = len(conflicts)
		s.InSync = err == nil
		s.LastPass = now
		s.PassTime = now.Sub(start)
		s.LastError = err
		if err == nil {
			s.LastSuccess = now
		}
	})
	return err
}

// Teardown removes everything the backend programs: our routes (on the
// device and on the underlay), the device's FDB and permanent neighbour
// entries, and the device. It is idempotent and stops Run from touching the
// kernel again. The daemon does not call it on shutdown — leaving the data
// path in place lets a restart drop no packets — only `overlayd teardown`.
func (b *Backend) Teardown(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.tornDown = true
	b.inSync = false
	defer b.publish(func(s *backend.Status) { s.DevicePresent, s.InSync, s.PeersProgrammed = false, false, 0 })

	var errs []error
	devIdx, ulIdx := -1, -1
	if dev, err := b.nl.LinkByName(b.name); err == nil {
		devIdx = dev.Index
	} else if !errors.Is(err, ErrLinkNotFound) {
		errs = append(errs, fmt.Errorf("look up %s: %w", b.name, err))
	}
	if ul, err := b.lookupUnderlay(); err == nil {
		ulIdx = ul.Index
	}
	routes, err := retryDump(b.nl.RouteList)
	if err != nil {
		errs = append(errs, fmt.Errorf("list routes: %w", err))
	}
	for _, r := range routes {
		if r.Protocol == RouteProtocol && (r.LinkIndex == devIdx || r.LinkIndex == ulIdx) {
			if err := b.exec(op{kind: opRouteDel, route: r}); err != nil {
				errs = append(errs, fmt.Errorf("delete route %v: %w", r, err))
			}
		}
	}
	if devIdx > 0 {
		fdbs, err := retryDump(func() ([]FDB, error) { return b.nl.FDBList(devIdx) })
		if err != nil {
			errs = append(errs, fmt.Errorf("list FDB of %s: %w", b.name, err))
		}
		for _, f := range fdbs {
			if err := b.exec(op{kind: opFDBDel, fdb: f}); err != nil {
				errs = append(errs, fmt.Errorf("delete FDB entry %v: %w", f, err))
			}
		}
		neighs, err := retryDump(func() ([]Neigh, error) { return b.nl.NeighList(devIdx) })
		if err != nil {
			errs = append(errs, fmt.Errorf("list neighbours of %s: %w", b.name, err))
		}
		for _, n := range neighs {
			if n.State&NUDPermanent != 0 {
				if err := b.exec(op{kind: opNeighDel, neigh: n}); err != nil {
					errs = append(errs, fmt.Errorf("delete neighbour %v: %w", n, err))
				}
			}
		}
		if err := b.write(func() error { return b.nl.LinkDel(devIdx) }); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete device %s: %w", b.name, err))
		}
	}
	b.devIndex.Store(-1)
	b.programmed = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("teardown of %s incomplete (run it again): %w", b.name, err)
	}
	b.log.Info("removed overlay device and all its routes")
	return nil
}
