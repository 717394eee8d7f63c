package vxlan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// specDelta compares two peer sets sorted by subnet (validated, so of one
// family): gone holds the peers of old that new no longer has or has
// changed, come the peers of new that old lacks or had otherwise.
func specDelta(old, new []Peer) (gone, come []Peer) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		c := 0 // how old[i] compares with new[j] when both are there
		if i < len(old) && j < len(new) {
			c = compareSubnet(old[i].Subnet, new[j].Subnet)
		}
		switch {
		case j == len(new) || i < len(old) && c < 0:
			gone = append(gone, old[i])
			i++
		case i == len(old) || c > 0:
			come = append(come, new[j])
			j++
		default:
			if old[i] != new[j] {
				gone = append(gone, old[i])
				come = append(come, new[j])
			}
			i++
			j++
		}
	}
	return gone, come
}

// prefixKey orders IPv4 prefixes as comparePrefix does.
func prefixKey(p netip.Prefix) uint64 {
	a := p.Addr().As4()
	return uint64(a[0])<<32 | uint64(a[1])<<24 | uint64(a[2])<<16 | uint64(a[3])<<8 | uint64(p.Bits())
}

// compareSubnet is comparePrefix with a fast path for two IPv4 prefixes,
// which every lease event of the IPv4 overlay compares by the thousand.
func compareSubnet(a, b netip.Prefix) int {
	if a.Addr().Is4() && b.Addr().Is4() {
		return cmp.Compare(prefixKey(a), prefixKey(b))
	}
	return comparePrefix(a, b)
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// peerIndex answers whether a kernel entry belongs to a desired peer, for
// the notification filter: specs are the desired peers sorted by subnet
// (so also by next hop, which is unique), macs their MACs sorted. Sorted
// slices rather than maps: far less memory per peer, and this index is
// rebuilt at every change of the peer set.
type peerIndex struct {
	specs []Peer
	macs  []uint64 // macKey of each
}

// macKey is a MAC as an integer, for sorting and searching.
func macKey(m MAC) uint64 {
	return uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(m[2])<<24 | uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

func (x *peerIndex) hasSubnet(p netip.Prefix) bool {
	_, ok := slices.BinarySearchFunc(x.specs, p, func(s Peer, p netip.Prefix) int { return comparePrefix(s.Subnet, p) })
	return ok
}

func (x *peerIndex) hasHop(a netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(x.specs, a, func(s Peer, a netip.Addr) int { return s.Subnet.Addr().Compare(a) })
	return ok
}

func (x *peerIndex) hasMAC(m MAC) bool {
	_, ok := slices.BinarySearch(x.macs, macKey(m))
	return ok
}

// validatePeers sorts the daemon's peers by subnet and indexes them. Each
// peer's values were validated where the lease entered (Codec.Decode and
// subnet.Config.CheckPeer); what is checked here needs this host or the
// whole set: a peer must be of the backend's family, must not overlap our
// lease or use our address, and the first of two peers claiming one
// subnet, next hop or MAC (in subnet order) wins. Rejected peers are returned with the reason.
func validatePeers(peers []Peer, fam Family, own netip.Prefix, local netip.Addr) (specs []Peer, rejected map[string]string, idx peerIndex) {
	reject := func(p Peer, why string) {
		if rejected == nil {
			rejected = make(map[string]string)
		}
		rejected[fmt.Sprintf("%v %v %v", p.Subnet, p.PublicIP, PeerMAC(p))] = why
	}
	if len(peers) >= 1<<24 {
		// More peers than the sort below can number (a /8 of /24s is
		// 65,536): refuse them all rather than mis-sort.
		for _, p := range peers {
			reject(p, "too many peers")
		}
		return nil, rejected, peerIndex{}
	}
	// keys are the valid peers, by subnet and then position; the position
	// (below 1<<24) is in the low 24 bits of each.
	keys := make([]uint64, 0, len(peers))
	for i, p := range peers {
		switch {
		case !famHas(fam, p.Subnet.Addr()) || !famHas(fam, p.PublicIP) || p.PublicIP.Zone() != "" || PeerMAC(p).IsZero():
			reject(p, "not an "+fam.String()+" peer with a VTEP MAC")
		case local.IsValid() && p.PublicIP == local:
			reject(p, "public IP is our own")
		case own.IsValid() && p.Subnet.Overlaps(own):
			reject(p, "subnet overlaps our own lease")
		case fam == IPv6:
			keys = append(keys, uint64(i))
		default:
			// Every IPv4 subnet's order (comparePrefix's) is that of a
			// 40-bit integer: with the position below it, one plain sort
			// of integers orders them, equal subnets as given. This runs
			// at every lease event, so it sorts 8-byte keys rather than
			// stable-sorting the wide specs (Documentation/benchmarks.md,
			// "events").
			keys = append(keys, prefixKey(p.Subnet)<<24|uint64(i))
		}
	}
	if fam == IPv6 {
		// 128-bit addresses fit no integer key: compare the subnets.
		slices.SortFunc(keys, func(a, b uint64) int {
			return cmp.Or(comparePrefix(peers[a].Subnet, peers[b].Subnet), cmp.Compare(a, b))
		})
	} else {
		slices.Sort(keys)
	}
	// Subnets and next hops (network addresses) are unique among the
	// accepted peers if each differs from the last accepted one: equal
	// ones are adjacent in this order. MACs are not: a set remembers them.
	specs = make([]Peer, 0, len(keys))
	seenMAC := make(map[MAC]struct{}, len(keys))
	var last netip.Prefix
	for _, k := range keys {
		p := peers[k&(1<<24-1)]
		_, dupMAC := seenMAC[PeerMAC(p)]
		switch {
		case last.IsValid() && p.Subnet == last:
			reject(p, "duplicate subnet")
		case last.IsValid() && p.Subnet.Addr() == last.Addr():
			reject(p, "network address used by another peer's subnet")
		case dupMAC:
			reject(p, "VTEP MAC used by another peer")
		default:
			last = p.Subnet
			seenMAC[PeerMAC(p)] = struct{}{}
			specs = append(specs, p)
		}
	}
	idx = peerIndex{specs: specs, macs: make([]uint64, len(specs))}
	for i, s := range specs {
		idx.macs[i] = macKey(PeerMAC(s))
	}
	slices.Sort(idx.macs)
	return specs, rejected, idx
}
