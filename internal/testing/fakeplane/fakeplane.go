// Package fakeplane is an in-memory backend.Plane, for tests of the daemon
// that need no kernel: a plane "programs" a peer by recording it, one pass
// per wake-up of its Run loop, as a real plane's reconciler does. It keeps
// a real plane's contract where the daemon relies on it: SetPeers never
// blocks and coalesces, Run returns once its context ends, Status is a
// consistent snapshot, OnProgrammed is called once per peer's current
// value from Run's goroutine.
package fakeplane

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/overlaynet/overlay/backend"
)

// Plane is a fake data plane of one family. Create it with New.
type Plane struct {
	// OnPass, if set before Run, is called after each pass (as
	// vxlan.Config.OnPass).
	OnPass func()

	family       backend.Family
	dev          backend.Device
	onProgrammed func(backend.Peer, time.Time)
	kick         chan struct{}

	mu         sync.Mutex
	desired    []backend.Peer
	programmed map[netip.Prefix]backend.Peer
	status     backend.Status
	running    bool
	tornDown   bool
	adopted    int // routes AdoptRoutes reports
	ensureErr  error
}

// New returns a plane of family fam whose device is dev (its name, MAC
// and MTU are what EnsureDevice reports); onProgrammed, if set, is called
// when a peer's current value is programmed.
func New(fam backend.Family, dev backend.Device, onProgrammed func(backend.Peer, time.Time)) *Plane {
	p := &Plane{family: fam, dev: dev, onProgrammed: onProgrammed, kick: make(chan struct{}, 1),
		programmed: map[netip.Prefix]backend.Peer{}}
	p.status.Device = dev.Name
	p.status.VtepMAC = slices.Clone(dev.MAC)
	return p
}

// FailEnsure makes EnsureDevice fail with err (nil: succeed again).
func (p *Plane) FailEnsure(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ensureErr = err
}

// SetAdoptable sets how many routes AdoptRoutes reports adopting.
func (p *Plane) SetAdoptable(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.adopted = n
}

// Family implements backend.Plane.
func (p *Plane) Family() backend.Family { return p.family }

// EnsureDevice implements backend.Plane: the device is present from now on.
func (p *Plane) EnsureDevice(ctx context.Context) (backend.Device, error) {
	if err := ctx.Err(); err != nil {
		return backend.Device{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ensureErr != nil {
		return backend.Device{}, p.ensureErr
	}
	p.tornDown = false
	p.status.DevicePresent, p.status.MTU = true, p.dev.MTU
	d := p.dev
	d.MAC = slices.Clone(d.MAC)
	return d, nil
}

// AdoptRoutes implements backend.Plane.
func (p *Plane) AdoptRoutes(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.adopted, nil
}

// SetPeers implements backend.Plane: the set is copied, and Run woken.
func (p *Plane) SetPeers(peers []backend.Peer) {
	p.mu.Lock()
	p.desired = append(p.desired[:0:0], peers...)
	p.status.Pending = true
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run implements backend.Plane: a pass at start and after every SetPeers,
// until ctx ends.
func (p *Plane) Run(ctx context.Context) error {
	p.mu.Lock()
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	for {
		p.pass()
		select {
		case <-ctx.Done():
			return nil
		case <-p.kick:
		}
	}
}

// pass "programs" the desired peers, and reports the new ones.
func (p *Plane) pass() {
	now := time.Now()
	p.mu.Lock()
	if p.tornDown {
		p.mu.Unlock()
		return
	}
	var fresh []backend.Peer
	next := make(map[netip.Prefix]backend.Peer, len(p.desired))
	for _, peer := range p.desired {
		if old, ok := p.programmed[peer.Subnet]; !ok || old != peer {
			fresh = append(fresh, peer)
		}
		next[peer.Subnet] = peer
	}
	p.programmed = next
	p.status.Peers, p.status.PeersProgrammed = len(next), len(next)
	p.status.InSync, p.status.Pending = true, false
	p.status.LastPass, p.status.LastSuccess = now, now
	p.status.Passes++
	p.mu.Unlock()
	if p.onProgrammed != nil {
		for _, peer := range fresh {
			p.onProgrammed(peer, now)
		}
	}
	if p.OnPass != nil {
		p.OnPass()
	}
}

// Status implements backend.Plane.
func (p *Plane) Status() backend.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.status
	s.VtepMAC = slices.Clone(s.VtepMAC)
	return s
}

// Teardown implements backend.Plane: nothing is programmed any more, and
// the device is gone.
func (p *Plane) Teardown(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tornDown = true
	p.programmed = map[netip.Prefix]backend.Peer{}
	p.status.DevicePresent, p.status.PeersProgrammed = false, 0
	return nil
}

// Programmed reports whether the last pass programmed a peer whose subnet
// is s.
func (p *Plane) Programmed(s netip.Prefix) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.programmed[s]
	return ok
}

// Peer returns the programmed peer whose subnet is s.
func (p *Plane) Peer(s netip.Prefix) (backend.Peer, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	peer, ok := p.programmed[s]
	return peer, ok
}

// Running reports whether Run is running.
func (p *Plane) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// TornDown reports whether Teardown was called since the last EnsureDevice.
func (p *Plane) TornDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tornDown
}

// MAC is a convenience for tests: a device MAC from its last byte.
func MAC(last byte) net.HardwareAddr { return net.HardwareAddr{0x0e, 0xfa, 0, 0, 0, last} }

var _ backend.Plane = (*Plane)(nil)
