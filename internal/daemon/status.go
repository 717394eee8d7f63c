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
	LeasesRejected  int `json:"leasesRejected"`

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
	mgr      *etcdv3.Manager
	be       backend.Backend
	expected int
	rejected int
}

func (p *probe) set(f func(p *probe)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// status evaluates the readiness conditions at now.
func (p *probe) status(now time.Time) Status {
	p.mu.Lock()
	mgr, be := p.mgr, p.be
	s := Status{Node: p.node, Iface: p.iface, PeersExpected: p.expected, LeasesRejected: p.rejected}
	if p.publicIP.IsValid() {
		s.PublicIP = p.publicIP.String()
	}
	p.mu.Unlock()

	etcdOK := Condition{Name: "etcd", Reason: "no etcd session yet"}
	leaseOK := Condition{Name: "lease", Reason: "no lease acquired yet"}
	if mgr != nil {
		etcdOK.OK = mgr.Alive()
		if !etcdOK.OK {
			etcdOK.Reason = "etcd session lost: liveness key not held (etcd unreachable?)"
		} else {
			etcdOK.Reason = ""
		}
		l := mgr.Lease()
		s.Subnet, s.Reserved = l.Subnet.String(), l.Reserved
		exp := mgr.Expires()
		switch {
		case l.Reserved:
			leaseOK.OK, leaseOK.Reason = true, ""
		case exp.After(now):
			leaseOK.OK, leaseOK.Reason = true, ""
			s.LeaseExpires = &exp
		default:
			leaseOK.Reason = "lease expired or not renewed"
			if !exp.IsZero() {
				s.LeaseExpires = &exp
			}
		}
	}
	deviceOK := Condition{Name: "device", Reason: "device not set up yet"}
	reconcileOK := Condition{Name: "reconcile", Reason: "no reconcile pass yet"}
	if be != nil {
		st := be.Status()
		s.Device, s.MTU, s.PeersProgrammed = st.Device, st.MTU, st.PeersProgrammed
		if st.VtepMAC != nil {
			s.VtepMAC = st.VtepMAC.String()
		}
		deviceOK.OK = st.DevicePresent
		deviceOK.Reason = ""
		if !deviceOK.OK {
			deviceOK.Reason = st.Device + " is missing or does not match"
		}
		if !st.LastPass.IsZero() {
			last := st.LastPass
			s.LastReconcile = &last
			reconcileOK.OK, reconcileOK.Reason = st.LastError == nil, ""
			if st.LastError != nil {
				s.LastError = st.LastError.Error()
				reconcileOK.Reason = "last pass failed: " + s.LastError
			}
		}
	}
	s.Conditions = []Condition{etcdOK, leaseOK, deviceOK, reconcileOK}
	s.Ready = true
	for _, c := range s.Conditions {
		s.Ready = s.Ready && c.OK
	}
	return s
}
