package daemon

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet"
)

// Logs and counters say only what happened: "peer added" is logged for
// a key that became a peer, not for an unclaimed reservation or a value
// then skipped as invalid; this host's own reservation, which it adopts,
// is neither a peer nor an invalid lease; a peer whose value turns bad is
// removed, and a key that never was a peer is removed silently.
func TestPeerEventsSayOnlyWhatHappened(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	var logs bytes.Buffer
	st := &probe{}
	d := &daemon{log: slog.New(slog.NewTextHandler(&logs, nil)), st: st, m: newMetrics(st),
		lease: subnet.Lease{Subnet: own.IPv4}, peers: newPeerSet(cfg, testCodec(t, cfg.Backend), own, prefixed)}
	reservation := func(sub string, rev int64) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Reserved: true, ModRevision: rev, Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.9"}}
	}
	step := func(name string, b subnet.Batch, wantLines []string, wantInvalid float64) {
		t.Helper()
		logs.Reset()
		d.onBatch(b)
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if line != "" {
				_, msg, _ := strings.Cut(line, "msg=")
				got = append(got, msg)
			}
		}
		if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
			t.Errorf("%s: logged\n%s\nwant\n%s", name, strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
		}
		var m dto.Metric
		if err := d.m.rejectionsTotal.Write(&m); err != nil {
			t.Fatal(err)
		}
		if n := m.GetCounter().GetValue(); n != wantInvalid {
			t.Errorf("%s: overlay_leases_invalid_total = %v, want %v", name, n, wantInvalid)
		}
	}
	own1 := reservation("10.244.1.0/24", 1)
	step("arrivals", subnet.Batch{Events: []subnet.Event{
		{Type: subnet.Added, Lease: own1}, // ours, being adopted
		{Type: subnet.Added, Lease: lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)},
		{Type: subnet.Added, Lease: reservation("10.244.3.0/24", 3)},
		{Type: subnet.Added, Lease: lease("10.244.4.0/24", "198.18.0.4", "00:00:00:00:00:00", 4)}, // zero MAC
	}}, []string{
		`"peer added" peer=10.244.2.0/24 public_ip=198.18.0.2 node_id="" vtep_mac=0e:00:00:00:00:02`,
		`"skipping invalid lease" key=/coreos.com/network/subnets/10.244.4.0-24 err="invalid lease: VtepMAC is all zeros"`,
	}, 1)
	step("changes", subnet.Batch{Events: []subnet.Event{
		{Type: subnet.Changed, Lease: lease("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01", 5)}, // adopted
		{Type: subnet.Changed, Lease: lease("10.244.2.0/24", "198.18.0.2", "01:00:5e:00:00:01", 6)}, // turns bad
		{Type: subnet.Removed, Lease: reservation("10.244.3.0/24", 3)},
		{Type: subnet.Changed, Lease: lease("10.244.4.0/24", "198.18.0.4", "0e:00:00:00:00:04", 7)}, // fixed
		{Type: subnet.Added, Lease: lease("10.244.5.0/24", "198.18.0.5", "0e:00:00:00:00:05", 8)},
		{Type: subnet.Changed, Lease: lease("10.244.5.0/24", "198.18.0.5", "0e:00:00:00:00:06", 9)}, // same batch
	}}, []string{
		`"peer removed" peer=10.244.2.0/24 public_ip=198.18.0.2 vtep_mac=0e:00:00:00:00:02`,
		`"peer added" peer=10.244.4.0/24 public_ip=198.18.0.4 node_id="" vtep_mac=0e:00:00:00:00:04`,
		`"peer added" peer=10.244.5.0/24 public_ip=198.18.0.5 node_id="" vtep_mac=0e:00:00:00:00:06`,
		`"skipping invalid lease" key=/coreos.com/network/subnets/10.244.2.0-24 err="invalid lease: VtepMAC 01:00:5e:00:00:01 is a multicast address"`,
	}, 2)
}

// A cold start records an arrival for each peer of the listing, and only
// for the peers: the own lease, a reservation, an invalid or an orphaned
// lease is never programmed, so an arrival of one would stay pending for
// good, and the thousands of arrivals, released once nothing is pending,
// would stay resident.
func TestColdStartRecordsArrivalsOfPeersOnly(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	st := &probe{}
	d := &daemon{log: slog.New(slog.DiscardHandler), st: st, m: newMetrics(st),
		lease: subnet.Lease{Subnet: own.IPv4}, peers: newPeerSet(cfg, testCodec(t, cfg.Backend), own, prefixed)}
	peers := []subnet.Lease{
		lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2),
		lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 3),
	}
	d.snap = subnet.Snapshot{Revision: 9, Leases: append([]subnet.Lease{
		lease("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01", 1), // our own
		{Subnet: netip.MustParsePrefix("10.244.4.0/24"), Reserved: true, ModRevision: 4, Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.4"}},
		lease("10.244.5.0/24", "198.18.0.5", "00:00:00:00:00:00", 5), // invalid: zero MAC
		lease("10.245.6.0/24", "198.18.0.6", "0e:00:00:00:00:06", 6), // orphaned: outside the network
	}, peers...)}
	d.seedPeers(time.Now())

	pending := func() []netip.Prefix {
		d.m.mu.Lock()
		defer d.m.mu.Unlock()
		return pendingArrivals(d.m)
	}
	if got, want := pending(), []netip.Prefix{peers[0].Subnet, peers[1].Subnet}; !slices.Equal(got, want) {
		t.Fatalf("arrivals recorded for %v, want the peers' alone, %v", got, want)
	}
	for _, p := range peers {
		d.m.programmed(backend.Peer{Subnet: p.Subnet}, time.Now())
	}
	if got := pending(); len(got) != 0 {
		t.Errorf("arrivals still pending once every peer is programmed: %v", got)
	}
}

// pendingArrivals is every subnet whose arrival is pending, the listed
// ones and the later events', sorted; m.mu is held.
func pendingArrivals(m *metrics) []netip.Prefix {
	var out []netip.Prefix
	for p := range m.pending {
		out = append(out, p)
	}
	for i, k := range m.listed.keys {
		if m.listed.done[i/64]&(1<<(i%64)) == 0 {
			var a [16]byte
			binary.BigEndian.PutUint64(a[:8], k.hi)
			binary.BigEndian.PutUint64(a[8:], k.lo)
			addr := netip.AddrFrom16(a)
			if k.bits&(1<<8) != 0 {
				addr = addr.Unmap()
			}
			out = append(out, netip.PrefixFrom(addr, int(k.bits&0xff)))
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// The event-to-programmed latency of a listed peer is measured from the
// listing's arrival, once; a later event of that peer supersedes it (the
// latency runs from the event), and a peer that goes away before it is
// programmed is no longer pending. Once nothing of the listing is pending
// its arrivals are released.
func TestListedArrivalsEndOnceAndYieldToEvents(t *testing.T) {
	m := newMetrics(&probe{})
	pfx := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24) }
	v6 := netip.MustParsePrefix("fd00:10:244:7::/64")
	listed := time.Unix(1000, 0)
	keys := []arrivalKey{arrivalKeyOf(pfx(3)), arrivalKeyOf(pfx(1)), arrivalKeyOf(pfx(2)), arrivalKeyOf(v6), arrivalKeyOf(pfx(1))}
	m.listingArrived(keys, listed)
	if got, want := pendingArrivals(m), []netip.Prefix{pfx(1), pfx(2), pfx(3), v6}; !slices.Equal(got, want) {
		t.Fatalf("pending after the listing: %v, want %v", got, want)
	}
	observed := func() (n uint64, sum float64) {
		var dm dto.Metric
		if err := m.eventLatency.Write(&dm); err != nil {
			t.Fatal(err)
		}
		return dm.GetHistogram().GetSampleCount(), dm.GetHistogram().GetSampleSum()
	}

	m.programmed(backend.Peer{Subnet: pfx(1)}, listed.Add(2*time.Second))
	if n, sum := observed(); n != 1 || sum != 2 {
		t.Fatalf("a listed peer programmed 2 s after the listing: %d observations summing %v s, want 1 of 2 s", n, sum)
	}
	m.programmed(backend.Peer{Subnet: pfx(1)}, listed.Add(3*time.Second))
	if n, _ := observed(); n != 1 {
		t.Fatalf("a listed peer programmed twice was observed %d times, want once", n)
	}
	event := listed.Add(5 * time.Second)
	m.eventArrived(pfx(2), event) // supersedes its listed arrival
	m.programmed(backend.Peer{Subnet: pfx(2)}, event.Add(time.Second))
	if n, sum := observed(); n != 2 || sum != 3 {
		t.Fatalf("after an event superseded a listed arrival: %d observations summing %v s, want 2 summing 3 s (2 + 1)", n, sum)
	}
	before := pendingArrivals(m)
	m.eventGone(netip.Prefix{}) // a rejected key that names no subnet
	if got := pendingArrivals(m); !slices.Equal(got, before) {
		t.Fatalf("a rejected key naming no subnet changed the pending arrivals: %v, want %v", got, before)
	}
	m.eventGone(pfx(3))
	m.programmed(backend.Peer{Subnet: pfx(3)}, event)
	if n, _ := observed(); n != 2 {
		t.Fatalf("a listed peer gone before it was programmed was observed: %d observations, want 2", n)
	}
	if got, want := pendingArrivals(m), []netip.Prefix{v6}; !slices.Equal(got, want) {
		t.Fatalf("pending: %v, want %v", got, want)
	}
	m.programmed(backend.Peer{Subnet: v6}, listed.Add(time.Second))
	if n, sum := observed(); n != 3 || sum != 4 {
		t.Fatalf("the IPv6 peer: %d observations summing %v s, want 3 summing 4 s", n, sum)
	}
	if m.listed.keys != nil || m.listed.done != nil {
		t.Errorf("the listing's arrivals are kept once none is pending: %d keys", len(m.listed.keys))
	}
}

// countingPlane counts the peer sets handed to it.
type countingPlane struct {
	backend.Plane
	sets []int // the size of each set handed over
}

func (p *countingPlane) SetPeers(peers []backend.Peer) { p.sets = append(p.sets, len(peers)) }

// A batch that changes no peer — this host's own lease, as at every cold
// start while the first pass runs, a reservation, a value skipped before
// and after — leaves the planes' set alone, and still updates the counts;
// a batch that changes one hands the whole set over.
func TestBatchesThatChangeNoPeerAreNotHandedToThePlanes(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	st := &probe{}
	plane := &countingPlane{}
	d := &daemon{log: slog.New(slog.DiscardHandler), st: st, m: newMetrics(st),
		lease: subnet.Lease{Subnet: own.IPv4}, peers: newPeerSet(cfg, testCodec(t, cfg.Backend), own, prefixed),
		planes: []*familyPlane{{family: backend.IPv4, plane: plane}}}
	peer2 := lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)
	reserved := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.3.0/24"), Reserved: true, ModRevision: 3, Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.3"}}
	bad := lease("10.244.4.0/24", "198.18.0.4", "00:00:00:00:00:00", 4)
	for _, c := range []struct {
		name     string
		b        subnet.Batch
		sets     []int // handed over by this batch
		reserved int   // the counts after it
	}{
		{"a peer arrives", subnet.Batch{Events: []subnet.Event{{Type: subnet.Added, Lease: peer2}}}, []int{1}, 0},
		{"our own lease", subnet.Batch{Events: []subnet.Event{{Type: subnet.Added, Lease: lease("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01", 5)}}}, nil, 0},
		{"a reservation", subnet.Batch{Events: []subnet.Event{{Type: subnet.Added, Lease: reserved}}}, nil, 1},
		{"an invalid value", subnet.Batch{Events: []subnet.Event{{Type: subnet.Added, Lease: bad}}}, nil, 1},
		{"the same peer again", subnet.Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: peer2}}}, nil, 1},
		{"a re-list", subnet.Batch{Resync: true, Events: []subnet.Event{{Type: subnet.Changed, Lease: peer2}}}, []int{1}, 1},
		{"a value the source could not read", subnet.Batch{Invalid: []subnet.Invalid{{Key: "node-2", Subnets: subnet.Subnets{IPv4: peer2.Subnet}, ModRevision: 6, Err: errors.New("bad annotation")}}}, []int{0}, 1},
		{"the peer is back", subnet.Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: peer2}}}, []int{1}, 1},
		{"the peer leaves", subnet.Batch{Events: []subnet.Event{{Type: subnet.Removed, Lease: peer2}}}, []int{0}, 1},
	} {
		plane.sets = nil
		d.onBatch(c.b)
		if !slices.Equal(plane.sets, c.sets) {
			t.Errorf("%s: sets of %v peers handed to the plane, want %v", c.name, plane.sets, c.sets)
		}
		if got := st.counts.reserved; got != c.reserved {
			t.Errorf("%s: status counts %d reservations, want %d", c.name, got, c.reserved)
		}
	}
}
