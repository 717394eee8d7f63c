package vxlan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/overlaynet/overlay/backend"
)

// Peer is backend.Peer, repeated here for convenience.
type Peer = backend.Peer

// Backend is the VXLAN data plane. Create it with New, call EnsureDevice to
// learn the VTEP MAC and MTU to publish, then run Run in a goroutine and feed
// it peer sets with SetPeers.
//
// It has three parts with one job each: the device (device.go) keeps the
// VXLAN device right; the reconciler (reconcile.go) owns the model of the
// kernel and brings the kernel to the desired peers, one pass at a time;
// the loop (loop.go, Run) decides when a pass runs. The kernel, and with it
// the reconciler and the device, belongs to whoever holds opMu: Run's
// loop, or a caller of EnsureDevice, Reconcile or Teardown.
type Backend struct {
	cfg  Config
	log  *slog.Logger
	nl   Netlink
	name string

	kick    chan struct{} // SetPeers: the desired state changed
	notify  chan struct{} // the kernel changed under us
	running atomic.Bool

	// What the notification filter (onEvent, on the subscription's
	// goroutine) compares against: the devices' indexes, written by the
	// kernel owner, and the desired peers' entries, written by SetPeers.
	devIndex      atomic.Int64
	underlayIndex atomic.Int64
	wanted        atomic.Pointer[peerIndex]

	mu      sync.Mutex // guards the fields below
	desired []Peer
	gen     uint64 // bumped by every SetPeers
	invalid map[string]string
	status  backend.Status // published by the kernel owner
	doneGen uint64         // generation the last finished pass worked on

	opMu sync.Mutex // held by whoever touches the kernel
	rec  *reconciler
}

var _ backend.Plane = (*Backend)(nil)

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
	name := cmp.Or(cfg.DeviceName, famDeviceName(cfg.fam, cfg.VNI))
	log = log.With("component", "vxlan", "device", name)
	hw := cfg.VtepMAC
	if hw == nil {
		hw = famVtepMAC(cfg.fam, cfg.NodeID, cfg.VNI)
	}
	mac, _ := backend.MACFrom(hw) // withDefaults checked an explicit one
	b := &Backend{
		cfg:    cfg,
		log:    log,
		nl:     nl,
		name:   name,
		kick:   make(chan struct{}, 1),
		notify: make(chan struct{}, 1),
	}
	stats := new(counters)
	b.rec = &reconciler{
		cfg:        cfg,
		nl:         nl,
		log:        log,
		dev:        &device{cfg: cfg, nl: nl, log: log, name: name, mac: mac, stats: stats},
		stats:      stats,
		conflicted: make(map[netip.Prefix]bool),
		publish:    b.publish,
		noteDevice: b.noteDevice,
	}
	b.devIndex.Store(-1)
	b.underlayIndex.Store(-1)
	b.status.Device = name
	b.status.VtepMAC = mac.HardwareAddr()
	return b, nil
}

// DeviceInfo describes the overlay device after EnsureDevice: its MAC is
// the VTEP MAC to publish in the lease (BackendData.VtepMAC).
type DeviceInfo = backend.Device

// EnsureDevice creates the overlay device or adopts the existing one,
// fixing in place what differs and recreating it if its identity differs.
// On a matching device it performs no writes. Run does the same at every
// full pass; the daemon calls this first to learn the MAC and MTU to
// publish.
func (b *Backend) EnsureDevice(ctx context.Context) (DeviceInfo, error) {
	if err := ctx.Err(); err != nil {
		return DeviceInfo{}, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	return b.rec.ensureDevice()
}

// AdoptRoutes makes the routes another program left on our device (of our
// family, not of our protocol) ours: each is replaced in place, same key
// (destination and metric), with our protocol, one atomic write per route.
// The next pass then replaces each by our route at its own metric, or
// removes it if no peer wants it, the way it treats any stale route of
// ours: the new route is in place before the old one goes. This is how a
// host taken over from flanneld keeps forwarding through the switch. It
// returns the number of routes adopted.
func (b *Backend) AdoptRoutes(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.opMu.Lock()
	defer b.opMu.Unlock()
	dev, err := b.nl.LinkByName(b.name)
	if err != nil {
		return 0, fmt.Errorf("adopt routes: %w", err)
	}
	routes, err := b.nl.RouteListFamily(b.cfg.fam)
	if err != nil {
		return 0, fmt.Errorf("adopt routes: list routes: %w", err)
	}
	var writes []Write
	for _, r := range routes {
		if r.LinkIndex == dev.Index && r.Protocol != RouteProtocol && !isConnected(r) {
			r.Protocol = RouteProtocol
			writes = append(writes, Write{Kind: RouteReplace, Route: r})
		}
	}
	adopted := 0
	for i, err := range b.nl.Write(writes) {
		if err != nil {
			return adopted, fmt.Errorf("adopt route %s: %w", writes[i].Route, err)
		}
		adopted++
	}
	return adopted, nil
}

// Family is the address family of the overlay b programs, chosen by its
// Config.
func (b *Backend) Family() Family { return b.cfg.fam }

// SetPeers implements backend.Plane. Invalid peers (of the other family,
// bad MAC, overlapping our lease, duplicates) are dropped, logged once and
// counted in Status.InvalidPeers. A set equal to the current one (in any
// order) is a no-op.
func (b *Backend) SetPeers(peers []Peer) {
	specs, rejected, idx := validatePeers(peers, b.cfg.fam, b.cfg.OwnSubnet, b.cfg.LocalIP)
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

// Status implements backend.Plane.
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

// publish updates the status under mu; the reconciler reports through it.
func (b *Backend) publish(f func(s *backend.Status)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(&b.status)
}

// noteDevice records which device and underlay the kernel owner last
// found, for the notification filter and the status.
func (b *Backend) noteDevice(dev, underlay Link, err error) {
	if err != nil {
		b.devIndex.Store(-1)
		b.publish(func(s *backend.Status) { s.DevicePresent = false })
		return
	}
	b.devIndex.Store(int64(dev.Index))
	b.underlayIndex.Store(int64(underlay.Index))
	b.publish(func(s *backend.Status) { s.DevicePresent, s.MTU = true, dev.MTU })
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

// pass runs one reconcile pass on the current desired peers; onlyPeers
// says the pass was woken by SetPeers alone (see reconciler.pass). It
// reports whether the pass listed the kernel.
func (b *Backend) pass(onlyPeers bool) (full bool, err error) {
	b.opMu.Lock()
	defer b.opMu.Unlock()
	b.mu.Lock()
	want, gen := b.desired, b.gen
	b.mu.Unlock()
	full, err = b.rec.pass(want, gen, onlyPeers)
	if !errors.Is(err, errTornDown) {
		b.mu.Lock()
		b.doneGen = gen
		b.mu.Unlock()
	}
	return full, err
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
	err := b.rec.teardown()
	b.devIndex.Store(-1)
	return err
}
