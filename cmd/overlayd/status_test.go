package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/daemon"
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
