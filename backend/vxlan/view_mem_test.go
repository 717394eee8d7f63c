package vxlan

import (
	"net/netip"
	"runtime"
	"testing"
)

// viewBytesPerPeer is the live heap a view holds per peer once a cold
// start has written the n peers of family fam (an entry of each kind per
// peer, recorded as the writes succeed).
func viewBytesPerPeer(tb testing.TB, fam Family, n int) float64 {
	own, local := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParseAddr("198.18.0.1")
	if fam == IPv6 {
		own, local = netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParseAddr("2001:db8::1")
	}
	want, _, _ := validatePeers(benchPeers(fam, n), fam, own, local)
	if len(want) != n {
		tb.Fatalf("%d of %d %v peers are valid", len(want), n, fam)
	}
	env := diffEnv{Family: fam, Dev: tDev, Underlay: tUnderlay}
	first := diff(want, viewOf(kernelState{}, env, 0))
	ops := first.ops()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := viewOf(kernelState{}, env, n)
	for _, o := range ops {
		v.record(o)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	runtime.KeepAlive(ops)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// A view of the IPv4 plane keeps its peers' addresses in 4 bytes: its
// memory per peer stays well under what 16-byte addresses cost (about 190
// bytes per peer at 10,000 peers).
func TestViewMemoryPerPeer(t *testing.T) {
	const n = 10000
	got := viewBytesPerPeer(t, IPv4, n)
	t.Logf("view of %d IPv4 peers: %.0f bytes per peer; IPv6: %.0f", n, got, viewBytesPerPeer(t, IPv6, n))
	if got > 120 {
		t.Errorf("a view of %d IPv4 peers holds %.0f bytes per peer, want at most 120", n, got)
	}
}

// BenchmarkViewMemory reports the live heap per peer of a view of 10,000
// peers of each family.
func BenchmarkViewMemory(b *testing.B) {
	for _, fam := range []Family{IPv4, IPv6} {
		b.Run(fam.String(), func(b *testing.B) {
			var per float64
			for b.Loop() {
				per = viewBytesPerPeer(b, fam, 10000)
			}
			b.ReportMetric(per, "B/peer")
		})
	}
}
