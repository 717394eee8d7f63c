package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/peerhealth"
)

// statusServer serves st on /status like a local overlayd.
func statusServer(t *testing.T, st daemon.Status) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestStatusShowsReadyDaemon(t *testing.T) {
	addr := statusServer(t, daemon.Status{
		Node: "h1", Iface: "eth0", PublicIP: "198.18.0.1", Subnet: "10.244.7.0/24",
		Device: "overlay.1", MTU: 1450, VtepMAC: "0e:00:00:00:00:01",
		PeersExpected: 2, PeersProgrammed: 2, LeasesReserved: 1, LeasesOrphaned: 2, Ready: true,
		Conditions: []daemon.Condition{{Name: "etcd", OK: true}, {Name: "lease", OK: true}, {Name: "device", OK: true}, {Name: "reconcile", OK: true}},
	})
	r := run(t, "", "", "status", "--health-addr", addr)
	if r.code != exitOK {
		t.Fatalf("status: %+v", r)
	}
	flat := strings.Join(strings.Fields(r.out), " ")
	for _, want := range []string{"subnet 10.244.7.0/24", "peers 2 programmed / 2 expected", "other leases 1 reserved, 2 orphaned, 0 invalid", "ready yes", "reconcile ok"} {
		if !strings.Contains(flat, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.out)
		}
	}
	r = run(t, "", "", "status", "--health-addr", addr, "-w", "json")
	var got daemon.Status
	if err := json.Unmarshal([]byte(r.out), &got); err != nil || got.Subnet != "10.244.7.0/24" || !got.Ready {
		t.Errorf("status -w json = %q (%v)", r.out, err)
	}
}

func TestStatusOfUnreadyDaemonFailsWithReasons(t *testing.T) {
	addr := statusServer(t, daemon.Status{Node: "h1", Ready: false, Conditions: []daemon.Condition{
		{Name: "etcd", Reason: "etcd session lost: liveness key not held (etcd unreachable?)"}, {Name: "device", OK: true}}})
	r := run(t, "", "", "status", "--health-addr", addr)
	if r.code != exitError || !strings.Contains(r.out, "FAIL: etcd session lost") || !strings.Contains(r.err, "not ready") {
		t.Errorf("unready status: %+v", r)
	}
}

func TestStatusWithoutDaemonSaysSo(t *testing.T) {
	r := run(t, "", "", "status", "--health-addr", "127.0.0.1:1")
	if r.code != exitError || !strings.Contains(r.err, "is `overlayd run` running here") {
		t.Errorf("no daemon: %+v", r)
	}
}

// During a roll of EnableIPv6 status says how many peers are programmed in
// their IPv4 half only, and the change pending on this host; it stays
// ready (configuration.md quotes both).
func TestStatusDuringAnIPv6Roll(t *testing.T) {
	const pending = "EnableIPv6 false -> true in /coreos.com/network/config: this host carries IPv4 only until overlayd restarts here (its lease then gains an IPv6 subnet of fd00:10:244::/56); restart overlayd host by host"
	addr := statusServer(t, daemon.Status{
		Node: "h1", Iface: "eth0", PublicIP: "198.18.0.1", Subnet: "10.244.7.0/24",
		PeersExpected: 2, PeersProgrammed: 2, PeersIPv4Only: 1, ConfigPending: pending, Ready: true,
		Conditions: []daemon.Condition{{Name: "config", OK: true}},
	})
	r := run(t, "", "", "status", "--health-addr", addr)
	lines := strings.Split(r.out, "\n")
	want := map[string]string{
		"peers":  "2 programmed / 2 expected (1 IPv4 only until its host has restarted: `overlayd lease list` shows its lease as ipv4-only)",
		"config": "pending restart: " + pending,
	}
	for _, l := range lines {
		key, value, _ := strings.Cut(l, "  ")
		if w, ok := want[key]; ok {
			if strings.TrimSpace(value) != w {
				t.Errorf("status row %q = %q, want %q", key, strings.TrimSpace(value), w)
			}
			delete(want, key)
		}
	}
	if r.code != exitOK || len(want) != 0 {
		t.Errorf("status during a roll: %+v; rows %v missing", r, want)
	}
	// The doc quotes the start of both rows.
	doc, err := os.ReadFile("../../Documentation/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(string(doc)), " ")
	for _, quote := range []string{"(1 IPv4 only until its host has restarted: …)", "pending restart: " + pending[:strings.Index(pending, " (its lease")] + " …"} {
		if !strings.Contains(flat, quote) {
			t.Errorf("configuration.md does not quote %q", quote)
		}
	}
}

// status --peers lists every peer's health, as a table and as the
// peerHealth JSON; plain status sums it up in one row naming the worst
// peer; a daemon that does not probe says so.
func TestStatusPeers(t *testing.T) {
	down := time.Date(2026, 11, 27, 17, 2, 11, 0, time.UTC)
	ph := &daemon.PeerHealth{
		Summary: peerhealth.Summary{Probing: true, SweepSeconds: 30, RatePerSecond: 100,
			IPv4:  peerhealth.FamilyCounts{Reachable: 1, Unreachable: 1, Sent: 261, Received: 250, Lost: 11},
			Worst: []peerhealth.PeerHealth{{Peer: "10.244.3.0/24", Family: "IPv4", VTEP: "10.244.3.0", PublicIP: "198.18.0.3", State: peerhealth.Unreachable, Since: down, ConsecutiveLosses: 11}}},
		Peers: []peerhealth.PeerHealth{
			{Peer: "10.244.3.0/24", Family: "IPv4", VTEP: "10.244.3.0", PublicIP: "198.18.0.3", State: peerhealth.Unreachable, Since: down, LastRTTMicros: 412, SmoothedRTTMicros: 398, ConsecutiveLosses: 11, Sent: 130, Received: 119, Lost: 11},
			{Peer: "10.244.9.0/24", Family: "IPv4", VTEP: "10.244.9.0", PublicIP: "198.18.0.9", State: peerhealth.Reachable, Since: down.Add(-time.Hour), LastRTTMicros: 388, SmoothedRTTMicros: 401, Sent: 131, Received: 131},
		},
	}
	var (
		mu    sync.Mutex
		asked []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.RawQuery)
		mu.Unlock()
		st := daemon.Status{Node: "h1", Ready: true, PeerHealth: &daemon.PeerHealth{Summary: ph.Summary}}
		if r.URL.Query().Get("peers") != "none" {
			st.PeerHealth.Peers = ph.Peers
		}
		_ = json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	r := run(t, "", "", "status", "--health-addr", addr, "--peers")
	if r.code != exitOK {
		t.Fatalf("status --peers: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "PEER") {
		t.Fatalf("status --peers: want a header and 2 rows:\n%s", r.out)
	}
	for i, want := range [][]string{
		{"10.244.3.0/24", "IPv4", "10.244.3.0", "198.18.0.3", "unreachable", "2026-11-27T17:02:11Z", "412µs", "398µs", "11", "130", "119", "11"},
		{"10.244.9.0/24", "IPv4", "10.244.9.0", "198.18.0.9", "reachable", "2026-11-27T16:02:11Z", "388µs", "401µs", "0", "131", "131", "0"},
	} {
		row := lines[i+1]
		for _, cell := range want {
			if !strings.Contains(row, cell) {
				t.Errorf("row %d %q lacks %q", i+1, row, cell)
			}
		}
	}
	r = run(t, "", "", "status", "--health-addr", addr, "--peers", "-w", "json")
	var got daemon.PeerHealth
	if err := json.Unmarshal([]byte(r.out), &got); err != nil || len(got.Peers) != 2 || got.Peers[0].State != peerhealth.Unreachable || got.IPv4.Lost != 11 || len(got.Worst) != 1 {
		t.Errorf("status --peers -w json = %q (%v)", r.out, err)
	}

	r = run(t, "", "", "status", "--health-addr", addr)
	if want := "peer health 1 reachable, 1 unreachable, 0 not probed yet (worst: 10.244.3.0/24 IPv4, unreachable since 2026-11-27T17:02:11Z; overlayd status --peers)"; !strings.Contains(strings.Join(strings.Fields(r.out), " "), want) {
		t.Errorf("status lacks %q:\n%s", want, r.out)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"peers=all", "peers=all", ""}; strings.Join(asked, ",") != strings.Join(want, ",") {
		t.Errorf("queries %q, want %q (plain status leaves the peers out)", asked, want)
	}

	off := statusServer(t, daemon.Status{Node: "h1", Ready: true})
	r = run(t, "", "", "status", "--health-addr", off, "--peers")
	if r.code != exitError || !strings.Contains(r.err, "--peer-probe=false") {
		t.Errorf("status --peers of a daemon that does not probe: %+v", r)
	}
}
