package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
