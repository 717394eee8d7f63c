package vxlan

import (
	"net/netip"
	"testing"
)

// BenchmarkLeaseEvent is the pure work of SetPeers and of the pass it
// wakes for one changed lease among 5,000 peers: validate and sort the
// set, then find the delta to the previous one, per family.
func BenchmarkLeaseEvent(b *testing.B) {
	const n = 5000
	for _, fam := range []Family{IPv4, IPv6} {
		b.Run(fam.String(), func(b *testing.B) {
			own, local := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParseAddr("198.18.0.1")
			if fam == IPv6 {
				own, local = netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParseAddr("2001:db8::1")
			}
			old, _, _ := validatePeers(benchPeers(fam, n), fam, own, local)
			next := benchPeers(fam, n)
			next[17].Data[2] = 9
			b.ReportAllocs()
			for b.Loop() {
				specs, _, _ := validatePeers(next, fam, own, local)
				specDelta(old, specs)
			}
		})
	}
}

// benchPeers returns n peers of family fam in a scrambled order.
func benchPeers(fam Family, n int) []Peer {
	out := make([]Peer, n)
	for i := range out {
		j := (i * 7919) % n
		out[i] = Peer{
			Subnet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + j/256), byte(j % 256), 0}), 24),
			PublicIP: netip.AddrFrom4([4]byte{198, 19, byte(j / 256), byte(j % 256)}),
			Data:     PeerData(MAC{0x0e, 1, 0, 0, byte(j >> 8), byte(j)}),
		}
		if fam == IPv6 {
			out[i].Subnet = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, byte(100 + j/256), 0, byte(j % 256)}), 64)
			out[i].PublicIP = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x19, 13: byte(j / 256), 15: byte(j % 256)})
		}
	}
	return out
}
