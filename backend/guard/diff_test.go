package guard_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/overlaynet/overlay/backend/guard"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func set(as []netip.Addr) map[netip.Addr]struct{} {
	m := map[netip.Addr]struct{}{}
	for _, a := range as {
		m[a] = struct{}{}
	}
	return m
}

func TestMissingAndStale(t *testing.T) {
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
			if got := guard.Missing(set(tc.have), tc.want); !slices.Equal(got, tc.missing) {
				t.Errorf("Missing = %v, want %v", got, tc.missing)
			}
			if got := guard.Stale(set(tc.have), tc.want); !slices.Equal(got, tc.stale) {
				t.Errorf("Stale = %v, want %v", got, tc.stale)
			}
			// Admit then Settle from have gives exactly want's addresses.
			after := set(tc.have)
			for _, a := range guard.Missing(after, tc.want) {
				after[a] = struct{}{}
			}
			for _, a := range guard.Stale(after, tc.want) {
				delete(after, a)
			}
			if len(after) != len(set(tc.want)) {
				t.Errorf("after Admit and Settle: %v, want %v", after, set(tc.want))
			}
			for a := range set(tc.want) {
				if _, ok := after[a]; !ok {
					t.Errorf("after Admit and Settle %s is missing", a)
				}
			}
		})
	}
}

func BenchmarkConvergedPass10k(b *testing.B) {
	want := make([]netip.Addr, 10000)
	for i := range want {
		want[i] = netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	}
	have := set(want)
	b.ReportAllocs()
	for b.Loop() {
		if guard.Missing(have, want) != nil || guard.Stale(have, want) != nil {
			b.Fatal("not converged")
		}
	}
}

func BenchmarkMissing10k(b *testing.B) {
	want := make([]netip.Addr, 10000)
	for i := range want {
		want[i] = netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	}
	have := set(want)
	for b.Loop() {
		guard.Missing(have, want)
	}
}
