package daemon

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/subnet"
)

// Status is what `overlayd status` and /status show about the local daemon.
type Status struct {
	Node     string `json:"node"`
	Iface    string `json:"iface,omitempty"`
	PublicIP string `json:"publicIP,omitempty"`

	Subnet       string     `json:"subnet,omitempty"`
	Reserved     bool       `json:"reserved"`
	LeaseExpires *time.Time `json:"leaseExpires,omitempty"`

	Device  string `json:"device,omitempty"`
	VtepMAC string `json:"vtepMAC,omitempty"`
	MTU     int    `json:"mtu,omitempty"`

	// The IPv6 data plane, in a network that carries IPv6.
	PublicIPv6 string `json:"publicIPv6,omitempty"`
	IPv6Subnet string `json:"ipv6Subnet,omitempty"`
	DeviceV6   string `json:"deviceV6,omitempty"`
	VtepMACv6  string `json:"vtepMACv6,omitempty"`
	MTUv6      int    `json:"mtuV6,omitempty"`

	PeersExpected   int `json:"peersExpected"`
	PeersProgrammed int `json:"peersProgrammed"`
	// PeersIPv4Only counts the peers programmed in their IPv4 half only:
	// their lease key predates a change of EnableIPv6 and is rekeyed
	// when their host restarts.
	PeersIPv4Only int `json:"peersIPv4Only,omitempty"`
	// LeasesRejected counts invalid lease keys; unclaimed reservations and
	// orphaned leases (outside the network config) are counted apart.
	LeasesRejected int `json:"leasesRejected"`
	LeasesReserved int `json:"leasesReserved"`
	LeasesOrphaned int `json:"leasesOrphaned"`

	// ConfigPending is a change of the stored network config this host
	// applies when overlayd restarts here (EnableIPv6 turned on or off),
	// meanwhile carrying IPv4 as before; it does not make it unready.
	ConfigPending string `json:"configPending,omitempty"`

	// GuardRefused are the sources whose datagrams to the VXLAN port the
	// VXLAN guard dropped in the last 10 minutes (as of the last check):
	// hosts without a lease, or hosts whose VXLAN datagrams leave from
	// another address than the public IP their lease publishes.
	GuardRefused []string `json:"guardRefused,omitempty"`

	LastReconcile *time.Time `json:"lastReconcile,omitempty"`
	LastError     string     `json:"lastError,omitempty"`

	// PeerHealth is what the probes of the peers through the overlay
	// found (absent with --peer-probe=false). It never affects Ready: a
	// dead peer must not make every other host unready.
	PeerHealth *PeerHealth `json:"peerHealth,omitempty"`

	Ready      bool        `json:"ready"`
	Conditions []Condition `json:"conditions"`
}

// PeerHealth is the probing of the peers (peerhealth.Summary: whether
// it runs, the counts per family, the worst few peers) and, when
// /status is asked with ?peers=all, every peer's record.
type PeerHealth struct {
	peerhealth.Summary
	Peers []peerhealth.PeerHealth `json:"peers,omitempty"`
}

// Condition is one readiness check.
type Condition struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
}

// probe is the live state readiness is judged on, filled in as the daemon
// starts. Fields are nil until that stage is reached.
type probe struct {
	mu       sync.Mutex
	node     string
	iface    string
	publicIP netip.Addr
	// phase says what start-up is waiting for; "" once it is over.
	phase string
	held  subnet.LeaseState // this host's lease, once acquired
	store string            // the lease source's name (subnet.Source.Name), with held
	// planes are the data planes, the IPv4 one first.
	planes []backend.Plane
	// guards are the planes' VXLAN guards (none with --vxlan-guard=false).
	guards []Guard
	env    *envKeeper
	config string // why the stored network config no longer fits, if it does not
	// own says why every host skips this host's lease key, if one does.
	own    string
	counts counts
	peers  int
	// refused are the VXLAN guards' refused sources at the last check.
	refused []string

	// health is the prober of the peers, once made (nil with
	// --peer-probe=false).
	health *peerhealth.Prober

	// pending is a change of the stored network config this host applies
	// when it restarts, while it keeps carrying traffic (see ipv6Toggled).
	pending string
}

func (p *probe) set(f func(p *probe)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// What the startup condition says, as operations.md quotes it: a step is
// "trying to <step>", or "waiting to <step>: <why>" while it is retried.
const (
	phaseTrying     = "trying to "
	phaseWaiting    = "waiting to "
	stepReach       = "reach " // and the source's Where: "etcd at <endpoints>"
	stepReadConfig  = "read the network config"
	stepClaimNodeID = "claim node ID " // and the quoted node ID
	stepAcquire     = "acquire a lease"
	phaseDevices    = "setting up the VXLAN devices"
)

// setPhase records what start-up is doing or waiting for.
func (p *probe) setPhase(reason string) { p.set(func(p *probe) { p.phase = reason }) }

// status evaluates the readiness conditions at now. During start-up the one
// condition is "startup", naming what it waits for; after it, each thing
// the daemon owns is a condition of its own. It leaves PeerHealth out and
// never asks the prober (whose lock the probing holds): /readyz and
// overlay_ready must not wait on it; /status adds it (peerHealth).
func (p *probe) status(now time.Time) Status {
	p.mu.Lock()
	mgr, store, planes, env, phase, config, own := p.held, p.store, p.planes, p.env, p.phase, p.config, p.own
	s := Status{Node: p.node, Iface: p.iface, PeersExpected: p.peers,
		LeasesRejected: p.counts.invalid, LeasesReserved: p.counts.reserved, LeasesOrphaned: p.counts.orphaned, PeersIPv4Only: p.counts.ipv4Only, ConfigPending: p.pending, GuardRefused: p.refused}
	if p.publicIP.IsValid() {
		s.PublicIP = p.publicIP.String()
	}
	p.mu.Unlock()

	if mgr != nil {
		l := mgr.Lease()
		if l.Subnet.IsValid() {
			s.Subnet, s.Reserved = l.Subnet.String(), l.Reserved
		}
		if l.IPv6Subnet.IsValid() {
			s.IPv6Subnet, s.PublicIPv6 = l.IPv6Subnet.String(), l.Attrs.PublicIPv6
		}
		if exp := mgr.Expires(); !l.Reserved && !exp.IsZero() {
			s.LeaseExpires = &exp
		}
	}
	var sts []backend.Status
	for _, be := range planes {
		st := be.Status()
		sts = append(sts, st)
		mac := ""
		if st.VtepMAC != nil {
			mac = st.VtepMAC.String()
		}
		if be.Family() == backend.IPv6 {
			s.DeviceV6, s.MTUv6, s.VtepMACv6 = st.Device, st.MTU, mac
		} else {
			s.Device, s.MTU, s.VtepMAC = st.Device, st.MTU, mac
		}
	}
	if len(sts) > 0 {
		st := combined(sts)
		s.PeersProgrammed = st.PeersProgrammed
		if !st.LastPass.IsZero() {
			last := st.LastPass
			s.LastReconcile = &last
		}
		if st.LastError != nil {
			s.LastError = st.LastError.Error()
		}
	}
	if phase != "" || mgr == nil || len(planes) == 0 || env == nil {
		if phase == "" {
			phase = "starting"
		}
		s.Conditions = []Condition{{Name: "startup", Reason: phase}}
		return s
	}
	s.Conditions = []Condition{storeCondition(store, mgr), leaseCondition(mgr, now, own), deviceCondition(sts), reconcileCondition(sts),
		{Name: "subnet.env", Reason: env.problem()}, {Name: "config", Reason: config}}
	s.Ready = true
	for i := range s.Conditions {
		c := &s.Conditions[i]
		c.OK = c.Reason == ""
		s.Ready = s.Ready && c.OK
	}
	return s
}

// peerHealth is the prober's summary and, if all, every peer's record;
// nil with --peer-probe=false.
func (p *probe) peerHealth(all bool) *PeerHealth {
	p.mu.Lock()
	health := p.health
	p.mu.Unlock()
	if health == nil {
		return nil
	}
	ph := &PeerHealth{Summary: health.Summary()}
	if all {
		ph.Peers = health.Peers()
	}
	return ph
}

// storeCondition judges this host's liveness in the lease source named
// store (etcd: the condition "etcd").
func storeCondition(store string, mgr subnet.LeaseState) Condition {
	c := Condition{Name: store}
	switch alive, err := mgr.Liveness(); {
	case alive:
	case err == nil:
		c.Reason = "liveness key not written yet"
	default:
		c.Reason = store + " session lost: " + err.Error()
	}
	return c
}

// leaseState is what the lease condition is judged on (of
// subnet.LeaseState).
type leaseState interface {
	Lease() subnet.Lease
	Expires() time.Time
	KeyProblem() error
}

// leaseCondition judges the lease the manager holds and, once it holds
// it, own: why every host skips this host's lease key (peerSet.ownProblem),
// "" if none does. A lease no host programs carries no traffic, however
// well it is kept.
func leaseCondition(mgr leaseState, now time.Time, own string) Condition {
	c := Condition{Name: "lease"}
	l := mgr.Lease()
	switch exp := mgr.Expires(); {
	case mgr.KeyProblem() != nil:
		// Each subnet of the lease: the IPv6 one alone on an IPv6-only host.
		c.Reason = mgr.KeyProblem().Error() + "; re-claiming " + l.Subnets().String()
	case !l.Reserved && !exp.After(now):
		c.Reason = "lease expired or not renewed"
	default:
		c.Reason = own
	}
	return c
}

func deviceCondition(sts []backend.Status) Condition {
	c := Condition{Name: "device"}
	var missing []string
	for _, st := range sts {
		if !st.DevicePresent {
			missing = append(missing, st.Device)
		}
	}
	if len(missing) > 0 {
		c.Reason = strings.Join(missing, " and ") + " missing or not matching"
	}
	return c
}

func reconcileCondition(sts []backend.Status) Condition {
	c := Condition{Name: "reconcile"}
	for _, st := range sts {
		switch {
		case st.LastPass.IsZero():
			c.Reason = "no reconcile pass yet on " + st.Device
		case st.LastError != nil:
			c.Reason = "last pass on " + st.Device + " failed: " + st.LastError.Error()
		}
		if c.Reason != "" {
			return c
		}
	}
	return c
}

// combined sums up the data planes' statuses as one: the device present
// and in sync only if every one is, the latest pass, the first error, and
// the other counts added. Peers are the exception: every plane is handed
// the same peers, so Peers is the largest plane's count, and a peer is
// programmed only once every plane has it, so PeersProgrammed is the
// smallest's (exact when the planes lag on the same peers, too high by
// the peers missing from one plane only while others miss from another).
func combined(sts []backend.Status) backend.Status {
	var c backend.Status
	for i, st := range sts {
		if i == 0 {
			c = st
			continue
		}
		c.Device += "+" + st.Device
		c.DevicePresent = c.DevicePresent && st.DevicePresent
		c.InSync, c.Pending = c.InSync && st.InSync, c.Pending || st.Pending
		c.Peers = max(c.Peers, st.Peers)
		c.PeersProgrammed = min(c.PeersProgrammed, st.PeersProgrammed)
		c.InvalidPeers += st.InvalidPeers
		c.Conflicts += st.Conflicts
		c.Passes += st.Passes
		c.Errors += st.Errors
		c.Writes += st.Writes
		c.DriftRepairs += st.DriftRepairs
		c.DeviceRecreations += st.DeviceRecreations
		c.PassTime = max(c.PassTime, st.PassTime)
		if st.LastPass.After(c.LastPass) {
			c.LastPass = st.LastPass
		}
		if st.LastSuccess.Before(c.LastSuccess) {
			c.LastSuccess = st.LastSuccess // both succeeded since then
		}
		if c.LastError == nil {
			c.LastError = st.LastError
		}
	}
	return c
}
