package daemon

import (
	"errors"
	"fmt"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
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
	cfg   *subnet.Config
	codec backend.Codec // reads the backend's part of each lease value
	own   subnet.ID
	name  func(subnet.Subnets) string // the source's name of a lease, for messages

	// valid holds, per address family (famIndex: IPv4, IPv6), each valid
	// peer as that family's plane takes it, by the subnets its key names;
	// a family the network does not carry stays empty.
	valid [2]map[subnet.ID]backend.Peer
	// bad maps each currently skipped lease to the revision reported: by
	// the subnets it names, or, for an invalid one naming none, by the
	// source's name of it.
	bad map[badKey]skip
	// reserved holds the unclaimed reservations.
	reserved map[subnet.ID]bool
	// half holds the peers programmed in their IPv4 half only: their key
	// names an IPv6 subnet the network does not carry, or lacks the one
	// it does (a roll of EnableIPv6, see subnet.Config.IPv4Only).
	half map[subnet.ID]bool
	// ownSkip is why every host, this one included, skips this host's own
	// lease key (invalid or orphaned), nil while it is valid: then no
	// peer routes to this host, and it must not report ready.
	ownSkip *rejection

	out [2][]backend.Peer // peers' results per family, reused unless given away
}

// skipKind is why a key is skipped.
type skipKind uint8

const (
	invalidLease  skipKind = iota // its key or value cannot be used
	orphanedLease                 // a lease outside the network config
)

// skip is a skipped key's kind and the revision reported, and the
// source's name of it (Invalid.Key), to forget it when the source reports
// it deleted (Batch.Deleted).
type skip struct {
	rev  int64
	kind skipKind
	key  string
}

// badKey names a skipped lease: by its subnets, or by the source's name
// of it if it names no subnets (id zero).
type badKey struct {
	id  subnet.ID
	key string
}

// badKeyOf is the bookkeeping key of a lease on sn, named key.
func badKeyOf(sn subnet.Subnets, key string) badKey {
	if sn == (subnet.Subnets{}) {
		return badKey{key: key}
	}
	return badKey{id: sn.ID()}
}

// rejection is a lease that will not be programmed.
type rejection struct {
	Key  string
	ID   subnet.Subnets // what the key names; zero if it does not parse
	Err  error
	Kind skipKind
}

// newPeerSet returns an empty peer set; name is the source's name of the
// lease on some subnets (subnet.Source.LeaseName), for messages.
func newPeerSet(cfg *subnet.Config, codec backend.Codec, own subnet.Subnets, name func(subnet.Subnets) string) *peerSet {
	return &peerSet{cfg: cfg, codec: codec, own: own.ID(), name: name, valid: [2]map[subnet.ID]backend.Peer{{}, {}}, bad: map[badKey]skip{}, reserved: map[subnet.ID]bool{}, half: map[subnet.ID]bool{}}
}

// reset replaces everything with a full listing.
func (s *peerSet) reset(snap subnet.Snapshot) []rejection {
	old := s.bad
	s.valid[0] = make(map[subnet.ID]backend.Peer, len(snap.Leases))
	s.valid[1] = map[subnet.ID]backend.Peer{}
	if s.cfg.EnableIPv6 {
		s.valid[1] = make(map[subnet.ID]backend.Peer, len(snap.Leases))
	}
	s.bad = map[badKey]skip{}
	s.reserved = map[subnet.ID]bool{}
	s.half = map[subnet.ID]bool{}
	s.ownSkip = nil
	var out []rejection
	for _, l := range snap.Leases {
		out = s.put(l, old, out)
	}
	return s.invalid(snap.Invalid, old, out)
}

// apply folds a watch batch in and returns the new rejections.
func (s *peerSet) apply(b subnet.Batch) []rejection {
	if b.Resync {
		// A re-list batch carries every invalid key again; start the
		// bookkeeping of keys naming no subnets afresh so deleted ones
		// vanish.
		for k := range s.bad {
			if k.id == (subnet.ID{}) {
				delete(s.bad, k)
			}
		}
	}
	var out []rejection
	for _, ev := range b.Events {
		if ev.Type == subnet.Removed {
			id := ev.Lease.ID()
			s.drop(id)
			delete(s.reserved, id)
			s.unmark(id)
			if id == s.own {
				s.ownSkip = nil // the lease manager re-claims it, and says so
			}
			continue
		}
		out = s.put(ev.Lease, s.bad, out)
	}
	for _, key := range b.Deleted {
		s.forget(key)
	}
	return s.invalid(b.Invalid, s.bad, out)
}

// forget drops the skipped lease the source names key (a deleted one).
func (s *peerSet) forget(key string) {
	delete(s.bad, badKey{key: key})
	for k, v := range s.bad {
		if v.key == key {
			delete(s.bad, k)
		}
	}
}

func (s *peerSet) key(id subnet.ID) string { return s.name(id.Subnets()) }

func (s *peerSet) put(l subnet.Lease, reported map[badKey]skip, out []rejection) []rejection {
	id := l.ID()
	delete(s.reserved, id)
	s.drop(id)
	if l.Unclaimed() && id == s.own {
		// Our own reservation, which this host is adopting: neither a peer
		// nor a lease to skip.
		s.unmark(id)
		return out
	}
	if l.Unclaimed() {
		// A reservation waiting for its host: no VTEP yet, but checked
		// like every claim (the same check `overlayd lease reserve` makes).
		if err := s.cfg.CheckClaim(l, s.codec); err != nil {
			return s.reject(l.Subnets(), s.key(id), l.ModRevision, err, skipKindOf(err), reported, out)
		}
		s.unmark(id)
		s.reserved[id] = true
		return out
	}
	// The backend's data of each family is decoded once, here, where the
	// lease enters: CheckPeer judges what the codec found, and the peers
	// keep the decoded data.
	p4, p6, is4, is6, err := codecs.Peers(s.cfg, s.codec, l)
	switch {
	case id == s.own && err == nil:
		// Our own lease is never a peer. Clear a mark left by a value
		// someone wrote over it before the lease manager restored it.
		s.unmark(id)
		s.ownSkip = nil
		return out
	case id == s.own:
		s.ownSkip = &rejection{Key: s.key(id), ID: l.Subnets(), Err: err, Kind: skipKindOf(err)}
		return s.reject(l.Subnets(), s.key(id), l.ModRevision, err, skipKindOf(err), reported, out)
	case err != nil:
		return s.reject(l.Subnets(), s.key(id), l.ModRevision, err, skipKindOf(err), reported, out)
	}
	s.unmark(id)
	if is4 {
		s.valid[famIndex(backend.IPv4)][id] = p4
	}
	if is6 {
		s.valid[famIndex(backend.IPv6)][id] = p6
	}
	if s.cfg.IPv4Half(l) {
		s.half[id] = true
	}
	return out
}

// programmedPeer is what the peer set holds of one peer, per family
// (famIndex); the zero Peer for a family it is no peer of.
type programmedPeer [2]backend.Peer

// programmed returns what the set holds of the peers b's events name.
func (s *peerSet) programmed(b subnet.Batch) map[subnet.ID]programmedPeer {
	out := map[subnet.ID]programmedPeer{}
	for _, ev := range b.Events {
		id := ev.Lease.ID()
		v4, ok4 := s.valid[0][id]
		v6, ok6 := s.valid[1][id]
		if ok4 || ok6 {
			out[id] = programmedPeer{v4, v6}
		}
	}
	return out
}

// isPeer reports whether id is a valid peer.
func (s *peerSet) isPeer(id subnet.ID) bool {
	_, ok4 := s.valid[0][id]
	_, ok6 := s.valid[1][id]
	return ok4 || ok6
}

// drop forgets the peer on id.
func (s *peerSet) drop(id subnet.ID) {
	delete(s.valid[0], id)
	delete(s.valid[1], id)
	delete(s.half, id)
}

// size is the number of valid peers.
func (s *peerSet) size() int { return max(len(s.valid[0]), len(s.valid[1])) }

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
func (s *peerSet) unmark(id subnet.ID) {
	if len(s.bad) > 0 {
		delete(s.bad, badKey{id: id})
	}
}

// invalid marks the leases whose value (or key) the source could not
// decode: the subnets the source says each names (none if its key names
// none) are no peer until a valid value arrives.
func (s *peerSet) invalid(inv []subnet.Invalid, reported map[badKey]skip, out []rejection) []rejection {
	for _, i := range inv {
		if sn := i.Subnets; sn != (subnet.Subnets{}) {
			s.drop(sn.ID()) // an undecodable value replaces whatever was there
			delete(s.reserved, sn.ID())
			if sn.ID() == s.own {
				s.ownSkip = &rejection{Key: i.Key, ID: sn, Err: i.Err, Kind: invalidLease}
			}
		}
		out = s.reject(i.Subnets, i.Key, i.ModRevision, i.Err, invalidLease, reported, out)
	}
	return out
}

func (s *peerSet) reject(id subnet.Subnets, key string, rev int64, err error, kind skipKind, reported map[badKey]skip, out []rejection) []rejection {
	k := badKeyOf(id, key)
	if seen, ok := reported[k]; !ok || seen.rev != rev || seen.kind != kind {
		out = append(out, rejection{Key: key, ID: id, Err: err, Kind: kind})
	}
	s.bad[k] = skip{rev, kind, key}
	return out
}

// peers returns the valid peers as the data plane of fam takes them (none
// for a family the network does not carry), in no particular order (the
// planes sort and check them), in a slice reused by the next call for
// that family unless given away (givenAway): the planes copy what they
// keep, and with thousands of peers fresh slices at every lease event
// would be most of the daemon's garbage.
func (s *peerSet) peers(fam backend.Family) []backend.Peer {
	i := famIndex(fam)
	s.out[i] = values(s.out[i], s.valid[i])
	return s.out[i]
}

// givenAway says that the last slice peers returned for fam is kept by
// its taker (the prober keeps it until it has read it, rather than
// copying it): the next call makes a new one, and the set no longer holds
// it.
func (s *peerSet) givenAway(fam backend.Family) { s.out[famIndex(fam)] = nil }

// famIndex is fam's index in the peer set's per-family arrays.
func famIndex(fam backend.Family) int {
	if fam == backend.IPv6 {
		return 1
	}
	return 0
}

// values puts m's values in buf, emptied and grown as needed.
func values(buf []backend.Peer, m map[subnet.ID]backend.Peer) []backend.Peer {
	if cap(buf) < len(m) {
		buf = make([]backend.Peer, 0, len(m)+len(m)/8)
	}
	buf = buf[:0]
	for _, p := range m {
		buf = append(buf, p)
	}
	return buf
}

// counts are the numbers of keys currently in each state that is not a
// peer, and of the peers programmed in their IPv4 half only.
type counts struct{ invalid, orphaned, reserved, ipv4Only int }

func (s *peerSet) counts() counts {
	c := counts{reserved: len(s.reserved), ipv4Only: len(s.half)}
	for _, k := range s.bad {
		if k.kind == orphanedLease {
			c.orphaned++
		} else {
			c.invalid++
		}
	}
	return c
}

// ownProblem says why this host's own lease key is skipped (by every
// host, as it is by this one), "" if it is not.
func (s *peerSet) ownProblem() string {
	r := s.ownSkip
	if r == nil {
		return ""
	}
	what := "invalid"
	if r.Kind == orphanedLease {
		what = "orphaned"
	}
	return fmt.Sprintf("this host's lease %s is %s, so every host skips it and none routes to this host: %v", r.Key, what, r.Err)
}

// rejected is the number of keys currently skipped as invalid.
func (s *peerSet) rejected() int { return s.counts().invalid }
