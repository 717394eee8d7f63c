package daemon

import (
	"bytes"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
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
		lease: subnet.Lease{Subnet: own.IPv4}, peers: newPeerSet(cfg, LeaseCodec(cfg.Backend), own, prefix)}
	reservation := func(sub string, rev int64) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Reserved: true, ModRevision: rev, Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.9"}}
	}
	step := func(name string, b etcdv3.Batch, wantLines []string, wantInvalid float64) {
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
	step("arrivals", etcdv3.Batch{Events: []subnet.Event{
		{Type: subnet.Added, Lease: own1}, // ours, being adopted
		{Type: subnet.Added, Lease: lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2)},
		{Type: subnet.Added, Lease: reservation("10.244.3.0/24", 3)},
		{Type: subnet.Added, Lease: lease("10.244.4.0/24", "198.18.0.4", "00:00:00:00:00:00", 4)}, // zero MAC
	}}, []string{
		`"peer added" peer=10.244.2.0/24 public_ip=198.18.0.2 node_id="" vtep_mac=0e:00:00:00:00:02`,
		`"skipping invalid lease" key=/coreos.com/network/subnets/10.244.4.0-24 err="invalid lease: VtepMAC is all zeros"`,
	}, 1)
	step("changes", etcdv3.Batch{Events: []subnet.Event{
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
// good, and the map of thousands of arrivals, replaced once nothing is
// pending, would stay resident.
func TestColdStartRecordsArrivalsOfPeersOnly(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	st := &probe{}
	d := &daemon{log: slog.New(slog.DiscardHandler), st: st, m: newMetrics(st),
		lease: subnet.Lease{Subnet: own.IPv4}, peers: newPeerSet(cfg, LeaseCodec(cfg.Backend), own, prefix)}
	peers := []subnet.Lease{
		lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 2),
		lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 3),
	}
	d.snap = etcdv3.Snapshot{Revision: 9, Leases: append([]subnet.Lease{
		lease("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01", 1), // our own
		{Subnet: netip.MustParsePrefix("10.244.4.0/24"), Reserved: true, ModRevision: 4, Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.4"}},
		lease("10.244.5.0/24", "198.18.0.5", "00:00:00:00:00:00", 5), // invalid: zero MAC
		lease("10.245.6.0/24", "198.18.0.6", "0e:00:00:00:00:06", 6), // orphaned: outside the network
	}, peers...)}
	d.seedPeers(time.Now())

	pending := func() []netip.Prefix {
		d.m.mu.Lock()
		defer d.m.mu.Unlock()
		var out []netip.Prefix
		for p := range d.m.pending {
			out = append(out, p)
		}
		slices.SortFunc(out, netip.Prefix.Compare)
		return out
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
