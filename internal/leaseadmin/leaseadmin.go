// Package leaseadmin holds the rules of `overlayd lease` and `overlayd
// config put`: how a key is judged (State), whether a reservation may be
// written (Reserve), whether a lease is unused by its host
// (UnusedByItsHost) or revoking it refused while its owner lives
// (RefuseRevoke), which leases a new network config strands
// (StrandedLeases), whose underlay a network would swallow
// (RefuseUnderlayInside), and how a value's host is named (DescribeOwner).
//
// The rules read and write the store through Store, a narrow view of
// etcdv3.Registry, so they are tested against a fake without etcd; the
// commands in cmd/overlayd pass the real registry and only parse flags,
// call a rule and print. A refusal (Refusal) is told from a store failure
// with errors.As: the command prints the first as it is and explains the
// second (which endpoint, which TLS setting).
package leaseadmin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Store is what the rules need of the lease store: a listing with its
// revision, the network config, the keys' names, and a reservation
// written only if nothing changed since a listing. EtcdStore makes an
// *etcdv3.Registry one.
type Store interface {
	// List returns every lease (and every undecodable key) with the
	// store's revision.
	List(ctx context.Context) (subnet.Snapshot, error)
	// GetConfig returns the network config (etcdv3.ErrNoConfig if none,
	// subnet.ErrInvalidConfig if it does not parse).
	GetConfig(ctx context.Context) (*subnet.Config, []byte, error)
	// Reserve writes a reservation for s if its key is free
	// (etcdv3.ErrTaken otherwise) and no lease was written after rev
	// (etcdv3.ErrConflict otherwise).
	Reserve(ctx context.Context, s subnet.Subnets, attrs subnet.LeaseAttrs, rev int64) (int64, error)
	ConfigKey() string
	LeaseKey(s subnet.Subnets) string
	// ParseKey reads a lease key back into its subnets.
	ParseKey(key string) (subnet.Subnets, error)
}

// EtcdStore is reg as a Store: the keys' names are its Keys'.
func EtcdStore(reg *etcdv3.Registry) Store { return etcdStore{reg, reg.Keys} }

type etcdStore struct {
	*etcdv3.Registry
	etcdv3.Keys
}

// Refusal is a write refused for what it is, not for a store failure: its
// message says what to do instead, and nothing was written.
type Refusal struct{ Err error }

func (r Refusal) Error() string { return r.Err.Error() }
func (r Refusal) Unwrap() error { return r.Err }

// Refusef makes a Refusal.
func Refusef(format string, args ...any) error { return Refusal{fmt.Errorf(format, args...)} }

// Lease states, as `lease list` shows them.
const (
	StateLeased   = "leased"   // a host's lease, with a TTL
	StateReserved = "reserved" // a reservation, adopted or waiting for its host
	StateOrphaned = "orphaned" // does not fit the network config: no host can use it
	StateInvalid  = "invalid"  // daemons skip it (bad address, MAC, ...)
	StateUnknown  = "unknown"  // no valid network config to judge it by
	// StateIPv4Only is a host's lease whose key predates a change of
	// EnableIPv6 (it names an IPv6 subnet the network no longer carries,
	// or lacks the one it now carries): daemons program its IPv4 half;
	// its host rekeys it when it restarts (subnet.Config.IPv4Only).
	StateIPv4Only = "ipv4-only"
)

// State judges l as every daemon does (Config.CheckPeer, or CheckClaim for a
// reservation no host has adopted yet). cfg nil: no valid config.
func State(cfg *subnet.Config, l subnet.Lease) (state, problem string) {
	if cfg == nil {
		return StateUnknown, ""
	}
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		return StateUnknown, err.Error()
	}
	if l.Unclaimed() {
		err = cfg.CheckClaim(l, codec)
	} else {
		err = cfg.CheckLease(l, codec)
	}
	switch {
	case errors.Is(err, subnet.ErrOrphaned):
		return StateOrphaned, err.Error()
	case err != nil:
		return StateInvalid, err.Error()
	case l.Unclaimed():
		return StateReserved, "" // its host rekeys it for the network's families when it adopts it
	case cfg.IPv4Only(l) != "":
		return StateIPv4Only, cfg.IPv4Only(l)
	case l.Reserved:
		return StateReserved, ""
	}
	return StateLeased, ""
}

// DescribeOwner names the host a lease value names, as messages show it:
// "198.18.0.7", "node h7 (198.18.0.7)", "node h7 (198.18.0.7, 2001:db8::7)"
// or, for a reservation waiting for its node, "node h7". The value is
// anyone's with write access to etcd: a node ID or address that is not
// one is shown quoted, so it can neither drive the terminal nor fake lines.
func DescribeOwner(a subnet.LeaseAttrs) string {
	node := subnet.ShownName(a.NodeID)
	var shown []string
	for _, s := range []string{a.PublicIP, a.PublicIPv6} {
		if s != "" {
			shown = append(shown, subnet.ShownAddr(s))
		}
	}
	addrs := strings.Join(shown, ", ")
	switch {
	case a.NodeID == "" && addrs == "":
		return "unknown: the value names no host"
	case a.NodeID == "":
		return addrs
	case addrs == "":
		return "node " + node
	}
	return fmt.Sprintf("node %s (%s)", node, addrs)
}

// PlainKey is an etcd key as messages show it: as it is if it holds only
// printable ASCII other than space, else quoted (anyone may write a key).
func PlainKey(key string) string {
	if strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return strconv.Quote(key)
	}
	return key
}

// UnusedByItsHost reports whether l is unused by its host, which holds
// another lease that fits the network config: l is orphaned (it does not
// fit) or a reservation its host never adopted (e.g. a second one for the
// same node). Revoking it takes nothing from the host even if it is alive.
func UnusedByItsHost(ctx context.Context, st Store, l subnet.Lease) (bool, error) {
	cfg, _, err := st.GetConfig(ctx)
	if err != nil {
		return false, nil // without a valid config nothing is known to be orphaned
	}
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		return false, err
	}
	if cfg.Orphaned(l, codec) == nil && !l.Unclaimed() {
		return false, nil
	}
	snap, err := st.List(ctx)
	if err != nil {
		return false, err
	}
	for _, other := range snap.Leases {
		if other.Subnets() != l.Subnets() && cfg.Orphaned(other, codec) == nil && other.Attrs.OwnedBy(l.Attrs.NodeID, l.Attrs.PublicAddr(), l.Attrs.PublicAddrV6()) {
			return true, nil
		}
	}
	return false, nil
}

// RefuseRevoke says why revoking l would take a subnet from a host that
// may be using it — its owner is alive (alive: the node IDs with a
// liveness key), or cannot be told alive or dead (a lease written
// without a node ID, e.g. by flanneld) — or nil. A key whose value names
// no host, and a lease UnusedByItsHost, are the caller's to let through
// first, as is --force.
func RefuseRevoke(l subnet.Lease, alive map[string]bool) error {
	name, owner := l.Subnets(), DescribeOwner(l.Attrs)
	switch {
	case l.Attrs.NodeID == "" && !l.Reserved:
		return fmt.Errorf("refusing to revoke %s: cannot tell whether its owner %s is alive (it was written without a node ID, e.g. by flanneld); use --force if that host is gone", name, owner)
	case alive[l.Attrs.NodeID]:
		return fmt.Errorf("refusing to revoke %s: its owner %s is alive and would re-claim it; stop overlayd there first or use --force", name, owner)
	}
	return nil
}
