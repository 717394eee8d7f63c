package daemon

import (
	"net/netip"
	"sync"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet/etcdv3"
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

	PeersExpected   int `json:"peersExpected"`
	PeersProgrammed int `json:"peersProgrammed"`
	// LeasesRejected counts invalid lease keys; unclaimed reservations and
	// orphaned leases (outside the network config) are counted apart.
	LeasesRejected int `json:"leasesRejected"`
	LeasesReserved int `json:"leasesReserved"`
	LeasesOrphaned int `json:"leasesOrphaned"`

	LastReconcile *time.Time `json:"lastReconcile,omitempty"`
	LastError     string     `json:"lastError,omitempty"`

	Ready      bool        `json:"ready"`
	Conditions []Condition `json:"conditions"`
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
	phase  string
	mgr    *etcdv3.Manager
	be     backend.Backend
	env    *envKeeper
	config string // why the stored network config no longer fits, if it does not
	counts counts
	peers  int
}

func (p *probe) set(f func(p *probe)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// setPhase records what start-up is doing or waiting for.
func (p *probe) setPhase(reason string) { p.set(func(p *probe) { p.phase = reason }) }

// status evaluates the readiness conditions at now. During start-up the one
// condition is "startup", naming what it waits for; after it, each thing
// the daemon owns is a condition of its own.
func (p *probe) status(now time.Time) Status {
	p.mu.Lock()
	mgr, be, env, phase, config := p.mgr, p.be, p.env, p.phase, p.config
	s := Status{Node: p.node, Iface: p.iface, PeersExpected: p.peers,
		LeasesRejected: p.counts.invalid, LeasesReserved: p.counts.reserved, LeasesOrphaned: p.counts.orphaned}
	if p.publicIP.IsValid() {
		s.PublicIP = p.publicIP.String()
	}
	p.mu.Unlock()

	if mgr != nil {
		l := mgr.Lease()
		if l.Subnet.IsValid() {
			s.Subnet, s.Reserved = l.Subnet.String(), l.Reserved
		}
		if exp := mgr.Expires(); !l.Reserved && !exp.IsZero() {
			s.LeaseExpires = &exp
		}
	}
	if be != nil {
		st := be.Status()
		s.Device, s.MTU, s.PeersProgrammed = st.Device, st.MTU, st.PeersProgrammed
		if st.VtepMAC != nil {
			s.VtepMAC = st.VtepMAC.String()
		}
		if !st.LastPass.IsZero() {
			last := st.LastPass
			s.LastReconcile = &last
		}
		if st.LastError != nil {
			s.LastError = st.LastError.Error()
		}
	}
	if phase != "" || mgr == nil || be == nil || env == nil {
		if phase == "" {
			phase = "starting"
		}
		s.Conditions = []Condition{{Name: "startup", Reason: phase}}
		return s
	}
	s.Conditions = []Condition{etcdCondition(mgr), leaseCondition(mgr, now), deviceCondition(be), reconcileCondition(be),
		{Name: "subnet.env", Reason: env.problem()}, {Name: "config", Reason: config}}
	s.Ready = true
	for i := range s.Conditions {
		c := &s.Conditions[i]
		c.OK = c.Reason == ""
		s.Ready = s.Ready && c.OK
	}
	return s
}

func etcdCondition(mgr *etcdv3.Manager) Condition {
	c := Condition{Name: "etcd"}
	switch alive, err := mgr.Liveness(); {
	case alive:
	case err == nil:
		c.Reason = "liveness key not written yet"
	default:
		c.Reason = "etcd session lost: " + err.Error()
	}
	return c
}

func leaseCondition(mgr *etcdv3.Manager, now time.Time) Condition {
	c := Condition{Name: "lease"}
	l := mgr.Lease()
	switch exp := mgr.Expires(); {
	case mgr.KeyProblem() != nil:
		c.Reason = mgr.KeyProblem().Error() + "; re-claiming " + l.Subnet.String()
	case l.Reserved:
	case !exp.After(now):
		c.Reason = "lease expired or not renewed"
	}
	return c
}

func deviceCondition(be backend.Backend) Condition {
	c := Condition{Name: "device"}
	if st := be.Status(); !st.DevicePresent {
		c.Reason = st.Device + " is missing or does not match"
	}
	return c
}

func reconcileCondition(be backend.Backend) Condition {
	c := Condition{Name: "reconcile"}
	switch st := be.Status(); {
	case st.LastPass.IsZero():
		c.Reason = "no reconcile pass yet"
	case st.LastError != nil:
		c.Reason = "last pass failed: " + st.LastError.Error()
	}
	return c
}
