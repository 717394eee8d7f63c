package daemon

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet"
)

const prefix = "/coreos.com/network/subnets/"

// prefixed names a lease as etcd's source does (Source.LeaseName).
func prefixed(s subnet.Subnets) string { return prefix + s.Key() }

func lease(sub, ip, mac string, rev int64) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(sub), ModRevision: rev,
		Attrs: subnet.LeaseAttrs{PublicIP: ip, BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"` + mac + `"}`)}}
}

func TestPeerSetValidatesSkipsOwnAndReportsOnce(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := netip.MustParsePrefix("10.244.1.0/24")
	s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: own}, prefixed)
	snap := subnet.Snapshot{Leases: []subnet.Lease{
		lease("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01", 1), // our own
		lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2),
		lease("10.244.3.0/24", "0.0.0.0", "0e:00:00:00:00:03", 3),    // bad public IP
		lease("10.244.4.0/24", "198.18.0.4", "00:00:00:00:00:00", 4), // zero MAC
	}, Invalid: []subnet.Invalid{{Key: prefix + "garbage", ModRevision: 5, Err: errors.New("bad key")}}}
	rej := s.reset(snap)
	if len(rej) != 3 || s.rejected() != 3 {
		t.Fatalf("reset: %d rejections (%v), %d rejected; want 3", len(rej), rej, s.rejected())
	}
	peers := s.peers(backend.IPv4)
	if len(peers) != 1 || peers[0].Subnet != netip.MustParsePrefix("10.244.2.0/24") {
		t.Fatalf("peers = %+v, want only 10.244.2.0/24", peers)
	}
	// A resync that finds the same bad keys at the same revisions is quiet.
	if rej := s.reset(snap); len(rej) != 0 {
		t.Errorf("second reset reported %v again", rej)
	}
	// Fixing a bad lease programs it; changing a good one to bad removes it.
	rej = s.apply(subnet.Batch{Events: []subnet.Event{
		{Type: subnet.Changed, Lease: lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 6)},
		{Type: subnet.Changed, Lease: lease("10.244.2.0/24", "198.18.0.2", "01:00:5e:00:00:01", 7)},
		{Type: subnet.Added, Lease: lease("10.244.5.0/24", "198.18.0.5", "0e:00:00:00:00:05", 8)},
		{Type: subnet.Removed, Lease: lease("10.244.4.0/24", "198.18.0.4", "00:00:00:00:00:00", 4)},
	}})
	if len(rej) != 1 || rej[0].Key != prefix+"10.244.2.0-24" {
		t.Errorf("apply rejections = %v, want 10.244.2.0-24 only", rej)
	}
	got := map[string]bool{}
	v4 := s.peers(backend.IPv4)
	for _, p := range v4 {
		got[p.Subnet.String()] = true
	}
	if len(got) != 2 || !got["10.244.3.0/24"] || !got["10.244.5.0/24"] {
		t.Errorf("peers after apply = %v, want 10.244.3.0/24 and 10.244.5.0/24", got)
	}
	// Left: the garbage key and the multicast-MAC lease.
	if s.rejected() != 2 {
		t.Errorf("rejected = %d, want 2", s.rejected())
	}
	// Deleting the garbage key removes no lease but ends its count.
	if rej := s.apply(subnet.Batch{Deleted: []string{prefix + "garbage"}}); len(rej) != 0 || s.rejected() != 1 {
		t.Errorf("after the garbage key's deletion: rejections %v, rejected = %d, want none and 1", rej, s.rejected())
	}
}

func TestNodeID(t *testing.T) {
	dir := t.TempDir()
	mid := filepath.Join(dir, "machine-id")
	if err := os.WriteFile(mid, []byte("0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, err := NodeID("node-a", mid); err != nil || id != "node-a" {
		t.Errorf("flag: %q, %v", id, err)
	}
	if id, err := NodeID("", mid); err != nil || id != "0123456789abcdef" {
		t.Errorf("machine-id: %q, %v", id, err)
	}
	host, _ := os.Hostname()
	if id, err := NodeID("", filepath.Join(dir, "missing")); err != nil || id != host {
		t.Errorf("hostname fallback: %q, %v; want %q", id, err, host)
	}
	for _, bad := range []string{"a/b", "../x", "a b", "x\x00y"} {
		if _, err := NodeID(bad, mid); err == nil {
			t.Errorf("NodeID(%q) accepted", bad)
		}
	}
}

func TestPeerSetNamesReservationsAndOrphans(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := netip.MustParsePrefix("10.244.1.0/24")
	s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: own}, prefixed)
	reservation := func(sub, ip, node string, rev int64) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Reserved: true, ModRevision: rev,
			Attrs: subnet.LeaseAttrs{PublicIP: ip, NodeID: node, BackendType: "vxlan"}}
	}
	claimed := lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 5)
	claimed.Reserved = true // an adopted reservation keeps no etcd lease
	rej := s.reset(subnet.Snapshot{Leases: []subnet.Lease{
		reservation("10.244.2.0/24", "198.18.0.2", "", 2),
		reservation("10.244.4.0/24", "", "later", 3),
		reservation("10.244.6.0/24", "0.0.0.0", "", 4),               // names no host: invalid
		lease("10.99.0.0/24", "198.18.0.9", "0e:00:00:00:00:09", 6),  // outside the network
		lease("10.244.8.0/25", "198.18.0.8", "0e:00:00:00:00:08", 7), // old SubnetLen
		reservation("10.98.0.0/24", "198.18.0.10", "", 8),            // reservation outside: orphaned
		claimed,
	}})
	if got := s.counts(); got != (counts{invalid: 1, orphaned: 3, reserved: 2}) {
		t.Fatalf("counts = %+v, want 1 invalid, 3 orphaned, 2 reserved", got)
	}
	kinds := map[skipKind]int{}
	for _, r := range rej {
		kinds[r.Kind]++
	}
	if kinds[invalidLease] != 1 || kinds[orphanedLease] != 3 {
		t.Errorf("reported %v, want 1 invalid and 3 orphaned", rej)
	}
	if peers := s.peers(backend.IPv4); len(peers) != 1 || peers[0].Subnet != claimed.Subnet {
		t.Errorf("peers = %+v, want only the claimed reservation", peers)
	}
	// Its host claims 10.244.2.0/24; 10.244.4.0/24 is revoked; the orphan
	// is cleaned up.
	rej = s.apply(subnet.Batch{Events: []subnet.Event{
		{Type: subnet.Changed, Lease: func() subnet.Lease {
			l := lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 9)
			l.Reserved = true
			return l
		}()},
		{Type: subnet.Removed, Lease: reservation("10.244.4.0/24", "", "later", 3)},
		{Type: subnet.Removed, Lease: lease("10.99.0.0/24", "198.18.0.9", "0e:00:00:00:00:09", 6)},
	}})
	if len(rej) != 0 {
		t.Errorf("apply reported %v", rej)
	}
	if got := s.counts(); got != (counts{invalid: 1, orphaned: 2}) {
		t.Errorf("counts after apply = %+v, want 1 invalid, 2 orphaned, 0 reserved", got)
	}
	if v4 := s.peers(backend.IPv4); len(v4) != 2 {
		t.Errorf("peers after the claim = %+v, want 2", v4)
	}
}

// During a roll of EnableIPv6 the keys of hosts restarted and of hosts not
// yet restarted name different families. Each is a peer in its IPv4 half
// (none is orphaned), counted as IPv4 only; a rekey (the old key removed,
// the new one added, in one batch) leaves the IPv4 peer as it was.
func TestPeerSetProgramsTheIPv4HalfDuringAnIPv6Roll(t *testing.T) {
	dualKey := func(sub, sub6, ip, mac string, rev int64) subnet.Lease {
		l := lease(sub, ip, mac, rev)
		l.IPv6Subnet = netip.MustParsePrefix(sub6)
		l.Attrs.PublicIPv6, l.Attrs.BackendV6Data = "fd18::9", []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:09"}`)
		return l
	}
	v4Key, dual := lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2), dualKey("10.244.3.0/24", "fd00:10:244:3::/64", "198.18.0.3", "0e:00:00:00:00:03", 3)
	for _, tc := range []struct {
		config   string
		half     subnet.Lease // the key of the other config
		want6    int
		rekeyed  subnet.Lease // v4Key's host restarted
		wantHalf int          // after the rekey
	}{
		{`{"Network":"10.244.0.0/16"}`, dual, 0, dualKey("10.244.2.0/24", "fd00:10:244:2::/64", "198.18.0.2", "0e:00:00:00:00:02", 4), 2},
		{`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`, v4Key, 1, dualKey("10.244.2.0/24", "fd00:10:244:2::/64", "198.18.0.2", "0e:00:00:00:00:02", 4), 0},
	} {
		cfg, err := subnet.ParseConfig([]byte(tc.config))
		if err != nil {
			t.Fatal(err)
		}
		s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}, prefixed)
		if rej := s.reset(subnet.Snapshot{Leases: []subnet.Lease{v4Key, dual}}); len(rej) != 0 {
			t.Fatalf("%s: rejected %v, want both keys as peers", tc.config, rej)
		}
		v4, v6 := s.peers(backend.IPv4), s.peers(backend.IPv6)
		if len(v4) != 2 || len(v6) != tc.want6 {
			t.Errorf("%s: %d IPv4 and %d IPv6 peers, want 2 and %d", tc.config, len(v4), len(v6), tc.want6)
		}
		if got := s.counts(); got != (counts{ipv4Only: 1}) {
			t.Errorf("%s: counts %+v, want one IPv4-only peer and nothing skipped", tc.config, got)
		}
		// v4Key's host restarts with the dual-stack config: its key is
		// replaced in one transaction.
		s.apply(subnet.Batch{Events: []subnet.Event{{Type: subnet.Removed, Lease: v4Key}, {Type: subnet.Added, Lease: tc.rekeyed}}})
		v4 = s.peers(backend.IPv4)
		found := false
		for _, p := range v4 {
			found = found || p.Subnet == v4Key.Subnet && p.PublicIP == netip.MustParseAddr("198.18.0.2")
		}
		if len(v4) != 2 || !found {
			t.Errorf("%s: after the rekey IPv4 peers %+v, want 10.244.2.0/24 still there", tc.config, v4)
		}
		if got := s.counts(); got != (counts{ipv4Only: tc.wantHalf}) {
			t.Errorf("%s: after the rekey counts %+v, want %d IPv4-only", tc.config, got, tc.wantHalf)
		}
	}
}

// A cold start records an arrival per listed peer (for the
// event-to-programmed latency) in a few bytes each: they are resident
// through the first pass, the start-up's peak of memory, and a map entry
// each took ~130 bytes, 1.3 MB at 10,000 peers (issue 33).
func TestColdStartArrivalsAreCompact(t *testing.T) {
	const n = 10000
	// MemStats counts every goroutine's allocations: the fewest of three
	// rounds is this code's, whatever else of the test binary still runs.
	least := uint64(math.MaxUint64)
	for range 3 {
		m := newMetrics(&probe{})
		now := time.Now()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		keys := make([]arrivalKey, 0, n)
		for i := range n {
			keys = append(keys, arrivalKeyOf(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)))
		}
		m.listingArrived(keys, now)
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
		if got := len(pendingArrivals(m)); got != n {
			t.Fatalf("%d arrivals pending, want %d", got, n)
		}
	}
	if perPeer := least / n; perPeer > 32 {
		t.Errorf("%d listed arrivals took %d bytes, %d a peer: want at most 32", n, least, perPeer)
	}
}

// A source that names a lease by something other than its subnets (a
// Kubernetes one names it by its Node) reports that node-b's value no
// longer decodes: the peer set takes the subnets from the source
// (Invalid.Subnets), not by parsing the name as etcd's key, turns node-b's
// peer off, counts it, and forgets it when the source reports it deleted.
func TestInvalidOfANonEtcdSourceTurnsThePeerOff(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	nodeB := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.2.0/24")}
	s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}, func(subnet.Subnets) string { return "node-?" })
	s.reset(subnet.Snapshot{Leases: []subnet.Lease{lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)}})
	rej := s.apply(subnet.Batch{Invalid: []subnet.Invalid{{Key: "node-b", Subnets: nodeB, ModRevision: 3, Err: errors.New("bad annotation")}}})
	if n := len(s.peers(backend.IPv4)); n != 0 {
		t.Fatalf("after node-b's value turned invalid: %d peer(s) still programmed", n)
	}
	if len(rej) != 1 || rej[0].Key != "node-b" || rej[0].ID != nodeB || s.counts().invalid != 1 {
		t.Fatalf("rejections %+v, counts %+v; want node-b's, on %v, counted once", rej, s.counts(), nodeB)
	}
	// Reported again at the same revision: not logged again.
	if rej := s.apply(subnet.Batch{Invalid: []subnet.Invalid{{Key: "node-b", Subnets: nodeB, ModRevision: 3, Err: errors.New("bad annotation")}}}); len(rej) != 0 {
		t.Fatalf("the same invalid value reported again: %+v", rej)
	}
	s.apply(subnet.Batch{Deleted: []string{"node-b"}})
	if c := s.counts(); c.invalid != 0 {
		t.Fatalf("after node-b was deleted: counts %+v, want no invalid lease", c)
	}
	// A valid value brings the peer back.
	s.apply(subnet.Batch{Events: []subnet.Event{{Type: subnet.Added, Lease: lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 5)}}})
	if n := len(s.peers(backend.IPv4)); n != 1 {
		t.Fatalf("after a valid value: %d peers, want 1", n)
	}
}

// A slice of peers given away (to the prober, which keeps it until it
// reads it) is not written again: the next one is new, and the one given
// away still holds the set it was given with.
func TestPeersGivenAwayAreNotReused(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}, prefixed)
	s.reset(subnet.Snapshot{Leases: []subnet.Lease{lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)}})
	given := s.peers(backend.IPv4)
	s.givenAway(backend.IPv4)
	s.apply(subnet.Batch{Events: []subnet.Event{
		{Type: subnet.Removed, Lease: lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)},
		{Type: subnet.Added, Lease: lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 3)},
	}})
	next := s.peers(backend.IPv4)
	if len(given) != 1 || given[0].Subnet != netip.MustParsePrefix("10.244.2.0/24") {
		t.Fatalf("the slice given away changed to %+v", given)
	}
	if len(next) != 1 || next[0].Subnet != netip.MustParsePrefix("10.244.3.0/24") {
		t.Fatalf("peers after the change: %+v", next)
	}
	// Not given away: reused, as before.
	if again := s.peers(backend.IPv4); &again[0] != &next[0] {
		t.Error("a slice not given away was not reused")
	}
}
