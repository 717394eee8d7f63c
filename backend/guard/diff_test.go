package guard

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/overlaynet/overlay/backend"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func peersAt(as []netip.Addr) []backend.Peer {
	var out []backend.Peer
	for _, a := range as {
		out = append(out, backend.Peer{PublicIP: a})
	}
	return out
}

func setOf(as []netip.Addr) addrSet {
	s := addrSet{}
	for _, a := range as {
		s[a] = 0
	}
	return s
}

// Admit's and Settle's arithmetic: what is added, what is removed, and
// that the two together leave exactly the desired addresses.
func TestAddMissingAndStale(t *testing.T) {
	for _, tc := range []struct {
		name           string
		have, want     []netip.Addr
		missing, stale []netip.Addr
	}{
		{"empty", nil, nil, nil, nil},
		{"cold start", nil, addrs("198.18.0.3", "198.18.0.2"), addrs("198.18.0.3", "198.18.0.2"), nil},
		{"converged", addrs("198.18.0.2", "198.18.0.3"), addrs("198.18.0.3", "198.18.0.2"), nil, nil},
		{"one joins", addrs("198.18.0.2"), addrs("198.18.0.2", "198.18.0.4"), addrs("198.18.0.4"), nil},
		{"one leaves", addrs("198.18.0.2", "198.18.0.4"), addrs("198.18.0.2"), nil, addrs("198.18.0.4")},
		{"two peers behind one address", nil, addrs("198.18.0.5", "198.18.0.5"), addrs("198.18.0.5"), nil},
		{"one of two behind one address leaves", addrs("198.18.0.5"), addrs("198.18.0.5"), nil, nil},
		{"all leave, sorted", addrs("2001:db8::9", "2001:db8::1", "2001:db8::5"), nil, nil, addrs("2001:db8::1", "2001:db8::5", "2001:db8::9")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := setOf(tc.have)
			// What left after a pass that was not full: the stale ones
			// among the peers that were there before.
			if got := setOf(tc.have).left(peersAt(tc.want), peersAt(tc.have)); !slices.Equal(got, tc.stale) {
				t.Errorf("left = %v, want %v", got, tc.stale)
			}
			if got := s.addMissing(peersAt(tc.want)); !slices.Equal(got, tc.missing) {
				t.Errorf("addMissing = %v, want %v", got, tc.missing)
			}
			if got := s.addMissing(peersAt(tc.want)); got != nil {
				t.Errorf("addMissing again = %v, want nothing", got)
			}
			for mark := uint32(1); mark <= 2; mark++ { // a second Settle finds nothing
				got := s.stale(peersAt(tc.want), mark)
				want := tc.stale
				if mark == 2 {
					want = nil
				}
				for _, a := range got {
					delete(s, a)
				}
				if !slices.Equal(got, want) {
					t.Errorf("stale #%d = %v, want %v", mark, got, want)
				}
			}
			if want := setOf(tc.want); len(s) != len(want) {
				t.Errorf("after Admit and Settle: %v, want %v", s, want)
			}
			for _, a := range tc.want {
				if _, ok := s[a]; !ok {
					t.Errorf("after Admit and Settle %s is missing", a)
				}
			}
		})
	}
}

func TestElementsEncodesEachFamily(t *testing.T) {
	for _, as := range [][]netip.Addr{addrs("198.18.0.2", "10.0.0.1"), addrs("2001:db8::2", "fd18::1")} {
		els := elements(as)
		for i, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); !ok || a != as[i] {
				t.Errorf("element %d = %x, want %s", i, e.Key, as[i])
			}
		}
	}
}

func BenchmarkConvergedFullPass10k(b *testing.B) {
	want := make([]backend.Peer, 10000)
	for i := range want {
		want[i].PublicIP = netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	}
	s := addrSet{}
	s.addMissing(want)
	b.ReportAllocs()
	mark := uint32(0)
	for b.Loop() {
		mark++
		if s.addMissing(want) != nil || s.stale(want, mark) != nil {
			b.Fatal("not converged")
		}
	}
}

func BenchmarkOneLeft10k(b *testing.B) {
	want := make([]backend.Peer, 10001)
	for i := range want {
		want[i].PublicIP = netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	}
	s := addrSet{}
	s.addMissing(want)
	keep, gone := want[:10000], want[10000:]
	b.ReportAllocs()
	for b.Loop() {
		if len(s.left(keep, gone)) != 1 {
			b.Fatal("the peer that left is not found")
		}
	}
}
