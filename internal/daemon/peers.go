package daemon

import (
	"errors"
	"net/netip"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// peerSet turns the lease set seen in etcd into the peer set handed to the
// data plane. It is pure and incremental: each lease is validated once, when
// it arrives (the values are untrusted), and our own subnet is left out.
// Every key that is not a peer is in one named state: an unclaimed
// reservation (waiting for its host), orphaned (a lease outside the
// network config, left by a config change) or invalid. A skipped key is
// reported once per revision, so a key that stays bad is logged once, not
// at every resync.
type peerSet struct {
	cfg    *subnet.Config
	own    netip.Prefix
	prefix string // the registry's subnets prefix, to name keys

	// valid holds each valid peer by subnet, as subnet.Config.Peer made it
	// (a value without pointers: a large set costs the collector nothing
	// to scan).
	valid map[netip.Prefix]backend.Peer
	// bad maps each currently skipped key to the revision reported.
	bad map[string]skip
	// reserved holds the unclaimed reservations.
	reserved map[netip.Prefix]bool

	out []backend.Peer // peers' result, reused
}

// skipKind is why a key is skipped.
type skipKind uint8

const (
	invalidLease  skipKind = iota // its key or value cannot be used
	orphanedLease                 // a lease outside the network config
)

// skip is a skipped key's kind and the revision reported.
type skip struct {
	rev  int64
	kind skipKind
}

// rejection is a lease that will not be programmed.
type rejection struct {
	Key  string
	Err  error
	Kind skipKind
}

func newPeerSet(cfg *subnet.Config, own netip.Prefix, subnetsPrefix string) *peerSet {
	return &peerSet{cfg: cfg, own: own, prefix: subnetsPrefix, valid: map[netip.Prefix]backend.Peer{}, bad: map[string]skip{}, reserved: map[netip.Prefix]bool{}}
}

// reset replaces everything with a full listing.
func (s *peerSet) reset(snap etcdv3.Snapshot) []rejection {
	old := s.bad
	s.valid = make(map[netip.Prefix]backend.Peer, len(snap.Leases))
	s.bad = map[string]skip{}
	s.reserved = map[netip.Prefix]bool{}
	var out []rejection
	for _, l := range snap.Leases {
		out = s.put(l, old, out)
	}
	return s.invalid(snap.Invalid, old, out)
}

// apply folds a watch batch in and returns the new rejections.
func (s *peerSet) apply(b etcdv3.Batch) []rejection {
	if b.Resync {
		// A re-list batch carries every invalid key again; start the
		// bookkeeping of undecodable keys afresh so deleted ones vanish.
		for key := range s.bad {
			if _, err := subnet.ParseKey(key[len(s.prefix):]); err != nil {
				delete(s.bad, key)
			}
		}
	}
	var out []rejection
	for _, ev := range b.Events {
		if ev.Type == subnet.Removed {
			delete(s.valid, ev.Lease.Subnet)
			delete(s.reserved, ev.Lease.Subnet)
			s.unmark(ev.Lease.Subnet)
			continue
		}
		out = s.put(ev.Lease, s.bad, out)
	}
	for _, key := range b.Deleted {
		delete(s.bad, key)
	}
	return s.invalid(b.Invalid, s.bad, out)
}

func (s *peerSet) key(p netip.Prefix) string { return s.prefix + subnet.Key(p) }

func (s *peerSet) put(l subnet.Lease, reported map[string]skip, out []rejection) []rejection {
	delete(s.reserved, l.Subnet)
	delete(s.valid, l.Subnet)
	if l.Unclaimed() && l.Subnet != s.own {
		// A reservation waiting for its host: no VTEP yet, but checked
		// like every claim (the same check `overlayd lease reserve` makes).
		if err := s.cfg.CheckClaim(l); err != nil {
			return s.reject(s.key(l.Subnet), l.ModRevision, err, skipKindOf(err), reported, out)
		}
		s.unmark(l.Subnet)
		s.reserved[l.Subnet] = true
		return out
	}
	peer, _, err := s.cfg.Peer(l) // the IPv6 peer waits for the IPv6 data plane
	switch {
	case l.Subnet == s.own && err == nil:
		// Our own lease is never a peer. Clear a mark left by a value
		// someone wrote over it before the lease manager restored it.
		s.unmark(l.Subnet)
		return out
	case err != nil:
		return s.reject(s.key(l.Subnet), l.ModRevision, err, skipKindOf(err), reported, out)
	}
	s.unmark(l.Subnet)
	s.valid[l.Subnet] = peer
	return out
}

// skipKindOf tells a lease that no longer fits the network config (left by
// a config change) from one that is wrong in itself.
func skipKindOf(err error) skipKind {
	if errors.Is(err, subnet.ErrOrphaned) {
		return orphanedLease
	}
	return invalidLease
}

// unmark forgets that p's key was rejected. (Most sets have no rejected
// key at all: then the key is not even spelled out, which at a cold start
// with thousands of leases saves as many strings.)
func (s *peerSet) unmark(p netip.Prefix) {
	if len(s.bad) > 0 {
		delete(s.bad, s.key(p))
	}
}

func (s *peerSet) invalid(inv []etcdv3.Invalid, reported map[string]skip, out []rejection) []rejection {
	for _, i := range inv {
		if p, err := subnet.ParseKey(i.Key[min(len(s.prefix), len(i.Key)):]); err == nil {
			delete(s.valid, p) // an undecodable value replaces whatever was there
			delete(s.reserved, p)
		}
		out = s.reject(i.Key, i.ModRevision, i.Err, invalidLease, reported, out)
	}
	return out
}

func (s *peerSet) reject(key string, rev int64, err error, kind skipKind, reported map[string]skip, out []rejection) []rejection {
	if seen, ok := reported[key]; !ok || seen != (skip{rev, kind}) {
		out = append(out, rejection{Key: key, Err: err, Kind: kind})
	}
	s.bad[key] = skip{rev, kind}
	return out
}

// peers returns the valid peers, in no particular order (the backend sorts
// and checks them), in a slice reused by the next call: the backend copies
// what it keeps, and with thousands of peers a fresh slice at every lease
// event would be most of the daemon's garbage.
func (s *peerSet) peers() []backend.Peer {
	if cap(s.out) < len(s.valid) {
		s.out = make([]backend.Peer, 0, len(s.valid)+len(s.valid)/8)
	}
	out := s.out[:0]
	for _, p := range s.valid {
		out = append(out, p)
	}
	return out
}

// counts are the numbers of keys currently in each state that is not a peer.
type counts struct{ invalid, orphaned, reserved int }

func (s *peerSet) counts() counts {
	c := counts{reserved: len(s.reserved)}
	for _, k := range s.bad {
		if k.kind == orphanedLease {
			c.orphaned++
		} else {
			c.invalid++
		}
	}
	return c
}

// rejected is the number of keys currently skipped as invalid.
func (s *peerSet) rejected() int { return s.counts().invalid }
