package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	"github.com/vishvananda/netlink"
)

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	t.Cleanup(cancel)
	return ctx
}

// metric reads one unlabelled metric's value from /metrics.
func metric(get func(string) (int, string), name string) string {
	_, body := get("/metrics")
	if v, ok := metricText(body, name); ok {
		return v
	}
	return "absent"
}

// metricText is one unlabelled metric's value in a /metrics body.
func metricText(body, name string) (string, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func status(t *testing.T, get func(string) (int, string)) Status {
	t.Helper()
	_, body := get("/status")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	return st
}

// A reservation nobody has claimed, and a lease outside the network, are
// states of their own: neither is an invalid lease in logs, metrics or
// status, and a reservation becomes a peer once its host claims it.
func TestReservationsAndOrphansAreNotInvalid(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	logs := h1.withLog(t)
	get := h1.withHealth(t)
	// Written as `overlayd lease reserve 10.244.50.0/24 --public-ip 198.18.0.2`
	// does, before h1 starts (the initial listing) and after (a watch event).
	reserved := netip.MustParsePrefix("10.244.50.0/24")
	if _, err := c.reg.Create(tctx(t), subnet.Subnets{IPv4: reserved}, subnet.LeaseAttrs{PublicIP: "198.18.0.2", BackendType: "vxlan"}, 0); err != nil {
		t.Fatal(err)
	}
	h1.start(t)
	later := netip.MustParsePrefix("10.244.51.0/24")
	if h1.env(t).Lease() == later { // h1's random pick: reserve another
		later = netip.MustParsePrefix("10.244.52.0/24")
	}
	if _, err := c.reg.Create(tctx(t), subnet.Subnets{IPv4: later}, subnet.LeaseAttrs{PublicIP: "198.18.0.9", NodeID: "later", BackendType: "vxlan"}, 0); err != nil {
		t.Fatal(err)
	}
	// A lease of the old network, left by a config change.
	orphan := `{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"NodeID":"old"}`
	if _, err := c.reg.Client().Put(tctx(t), c.reg.SubnetsPrefix()+"10.99.7.0-24", orphan); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, testenv.Slack, "two reservations and one orphan counted", func() error {
		st := status(t, get)
		if st.LeasesReserved != 2 || st.LeasesOrphaned != 1 || st.LeasesRejected != 0 {
			return fmt.Errorf("status: reserved %d orphaned %d invalid %d", st.LeasesReserved, st.LeasesOrphaned, st.LeasesRejected)
		}
		return nil
	})
	for name, want := range map[string]string{"overlay_leases_reserved": "2", "overlay_leases_orphaned": "1", "overlay_leases_invalid": "0", "overlay_leases_invalid_total": "0"} {
		if got := metric(get, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	if n := logs.count(t, "skipping invalid lease"); n != 0 {
		t.Errorf("%d lines say \"skipping invalid lease\" for reservations or orphans:\n%s", n, strings.Join(logs.lines(t), "\n"))
	}
	if n := logs.count(t, "skipping orphaned lease", "10.99.7.0-24"); n != 1 {
		t.Errorf("the orphan is logged %d times as \"skipping orphaned lease\", want once", n)
	}
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")

	// The reservation's host comes: it adopts it, and h1 programs it.
	h2 := c.addHost("h2", 2)
	h2.start(t)
	if got := h2.env(t).Lease(); got != reserved {
		t.Fatalf("h2 took %s, not its reservation %s", got, reserved)
	}
	testenv.WaitFor(t, testenv.Slack, "h1 to route to the claimed reservation", func() bool { return h1.routes(t)[reserved] })
	if st := status(t, get); st.LeasesReserved != 1 || st.LeasesRejected != 0 || st.PeersExpected != 1 {
		t.Errorf("after the claim: reserved %d invalid %d peers %d, want 1, 0, 1", st.LeasesReserved, st.LeasesRejected, st.PeersExpected)
	}
}

// subnet.env is the daemon's: deleted or altered, it comes back; while it
// cannot be written, /readyz says so.
func TestSubnetEnvIsRewrittenAndReadinessFollowsIt(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	logs := h1.withLog(t)
	get := h1.withHealth(t)
	h1.start(t)
	want, err := os.ReadFile(h1.cfg.SubnetFile)
	if err != nil {
		h1.env(t)
		want, _ = os.ReadFile(h1.cfg.SubnetFile)
	}
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")
	rewritten := func(what string) {
		t.Helper()
		testenv.Eventually(t, envCheckInterval+testenv.Slack, what, func() error {
			got, err := os.ReadFile(h1.cfg.SubnetFile)
			if err != nil || string(got) != string(want) {
				return fmt.Errorf("%q, %v", got, err)
			}
			return nil
		})
	}
	if err := os.Remove(h1.cfg.SubnetFile); err != nil {
		t.Fatal(err)
	}
	rewritten("deleted subnet.env rewritten")
	if err := os.WriteFile(h1.cfg.SubnetFile, []byte("OVERLAY_NETWORK=10.1.0.0/16\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rewritten("altered subnet.env rewritten")
	// The log line follows the rename the test saw.
	testenv.Eventually(t, testenv.Slack, "two repairs of subnet.env logged", func() error {
		if n := logs.count(t, "subnet.env was missing or altered; rewritten"); n != 2 {
			return fmt.Errorf("%d logged", n)
		}
		return nil
	})
	// A directory in its place: it cannot be rewritten; not ready, saying why.
	if err := os.Remove(h1.cfg.SubnetFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(h1.cfg.SubnetFile, 0o755); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, get, envCheckInterval+testenv.Slack, http.StatusServiceUnavailable, "subnet.env: "+h1.cfg.SubnetFile+" is not a regular file; cannot rewrite it: ")
	if err := os.Remove(h1.cfg.SubnetFile); err != nil {
		t.Fatal(err)
	}
	rewritten("subnet.env back once its path is free")
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")
}

// A running daemon notices a config change that strands its lease or
// needs a restart: not ready, naming it, logged once; ready again when the
// config is restored.
func TestConfigChangeIsNoticedByRunningDaemons(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	logs := h1.withLog(t)
	get := h1.withHealth(t)
	h1.start(t)
	own := h1.env(t).Lease()
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")
	put := func(cfg string) {
		t.Helper()
		if _, err := c.reg.PutConfig(tctx(t), []byte(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	const orig = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
	put(`{"Network":"10.50.0.0/16","Backend":{"Type":"vxlan"}}`)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable,
		"config: network config changed while running: /coreos.com/network/config: this host's lease "+own.String()+" is not a /24 inside Network 10.50.0.0/16: it is stranded")
	put(orig)
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")
	put(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":2}}`)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, "Backend.VNI 1 -> 2: the running device and subnet.env use the old values; restart overlayd")
	if _, err := c.reg.Client().Delete(tctx(t), c.reg.ConfigKey()); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, "config: network config changed while running: no network config at /coreos.com/network/config")
	put(orig)
	waitReadyz(t, get, testenv.Slack, http.StatusOK, "ready")
	if n := logs.count(t, "network config changed while running", "this host's lease "+own.String()+" is not a /24 inside Network 10.50.0.0/16: it is stranded. Restore the previous config"); n != 1 {
		t.Errorf("the stranding is logged %d times, want once", n)
	}
	if n := logs.count(t, "network config matches the running one again"); n != 2 {
		t.Errorf("the restorations are logged %d times, want 2", n)
	}
}

// A host restarted after a config change stranded its lease refuses to
// start (rather than hold two subnets), naming the lease and the fix;
// teardown releases the stranded lease, and then it starts in the new
// network.
func TestRestartWithStrandedLeaseRefusesUntilReleased(t *testing.T) {
	c := newCluster(t)
	h1, old := c.leasedOnce(t, "h1", 1)
	if _, err := c.reg.PutConfig(tctx(t), []byte(`{"Network":"10.50.0.0/16","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	h1.start(t)
	err := h1.waitDone(t, testenv.Slack, "restart with a stranded lease")
	if !errors.Is(err, etcdv3.ErrStranded) || !strings.Contains(err.Error(), old.String()) || !strings.Contains(err.Error(), "overlayd teardown") {
		t.Fatalf("restart with stranded lease %s: Run = %v, want ErrStranded naming it and the fix", old, err)
	}
	snap, lerr := c.reg.List(tctx(t))
	if lerr != nil || len(snap.Leases) != 1 || snap.Leases[0].Subnet != old {
		t.Fatalf("leases after the refused start = %+v (%v), want only the stranded %s", snap.Leases, lerr, old)
	}
	// The node ID claimed before the refusal is given up, not left to expire.
	if resp, err := c.reg.Client().Get(tctx(t), c.reg.NodeKey(h1.cfg.NodeName)); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("liveness key after the refused start: %v, %v; want it released", resp.Kvs, err)
	}
	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || res.LeaseRemoved != old.String() {
		t.Fatalf("teardown = %+v, %v; want the stranded lease %s released", res, err, old)
	}
	h1.start(t)
	if now := h1.env(t).Lease(); !netip.MustParsePrefix("10.50.0.0/16").Contains(now.Addr()) {
		t.Fatalf("after teardown h1 leased %s, want a subnet of 10.50.0.0/16", now)
	}
}

// A teardown that cannot remove one thing (here subnet.env, which is a
// directory by now) removes the rest all the same — the device, the table,
// the lease — and reports what failed.
func TestTeardownRemovesTheRestPastAFailure(t *testing.T) {
	c := newCluster(t)
	h1, own := c.leasedOnce(t, "h1", 1)
	if err := os.Remove(h1.cfg.SubnetFile); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(h1.cfg.SubnetFile, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err == nil || !strings.Contains(err.Error(), "remove "+h1.cfg.SubnetFile) {
		t.Fatalf("teardown = %v; want the failure to remove %s reported", err, h1.cfg.SubnetFile)
	}
	if !res.removed(vxlan.DeviceName(1)) || !res.MasqRemoved || res.LeaseRemoved != own.String() {
		t.Fatalf("teardown past the failure = %+v; want device, table and lease %s removed", res, own)
	}
}

// teardown refuses while the daemon runs, and afterwards reports only
// what it removed; with etcd down it says the lease was not released.
func TestTeardownRefusesWhileRunningAndReportsOnlyRemovals(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	h1.start(t)
	own := h1.env(t).Lease()
	if _, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1}); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("teardown under a running daemon = %v, want ErrRunning mentioning --force", err)
	}
	if _, err := os.Stat(h1.cfg.SubnetFile); err != nil {
		t.Errorf("the refused teardown removed subnet.env: %v", err)
	}
	if l, err := c.reg.Get(tctx(t), subnet.Subnets{IPv4: own}); err != nil || l.Attrs.NodeID != "h1" {
		t.Errorf("the refused teardown touched the lease: %+v %v", l, err)
	}
	h1.stop()

	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || !res.removed(vxlan.DeviceName(1)) || !res.MasqRemoved || res.LeaseRemoved != own.String() || res.SubnetFile != h1.cfg.SubnetFile {
		t.Fatalf("teardown = %+v, %v; want device, table, lease and subnet.env removed", res, err)
	}
	res, err = Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || res.removed(vxlan.DeviceName(1)) || res.MasqRemoved || res.LeaseRemoved != "" || res.SubnetFile != "" {
		t.Fatalf("second teardown = %+v, %v; want nothing reported removed", res, err)
	}

	// With etcd down: what is on the host goes, the lease is reported not
	// released, and it is an error.
	h1.start(t)
	h1.env(t)
	h1.stop()
	c.srv.Close()
	h1.cfg.Etcd.DialTimeout = time.Second
	res, err = Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if !errors.Is(err, ErrLeaseNotReleased) || !res.removed(vxlan.DeviceName(1)) || res.SubnetFile == "" || res.LeaseRemoved != "" {
		t.Fatalf("teardown with etcd down = %+v, %v; want the device and subnet.env removed and ErrLeaseNotReleased", res, err)
	}
	hl, herr := netlink.NewHandleAt(h1.host.NS)
	if herr != nil {
		t.Fatal(herr)
	}
	defer hl.Close()
	if _, err := hl.LinkByName("overlay.1"); err == nil {
		t.Error("teardown with etcd down left overlay.1")
	}
}

// Log lines are valid JSON with each key once, and every peer event is
// logged once (by the daemon, not again by the backend).
func TestLogLinesHaveUniqueKeysAndOneLinePerPeerEvent(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	logs := h1.withLog(t)
	h1.start(t)
	h1.env(t)
	h2.start(t)
	peer := h2.env(t).Lease()
	testenv.WaitFor(t, testenv.Slack, "h1 to route to h2", func() bool { return h1.routes(t)[peer] })
	h2.stop()
	if _, err := Teardown(context.Background(), h2.cfg, TeardownOptions{VNI: 1}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "h1 to drop h2", func() bool { return !h1.routes(t)[peer] })
	for _, ev := range []string{"peer added", "peer removed"} {
		if n := logs.count(t, ev, `"peer":"`+peer.String()+`"`); n != 1 {
			t.Errorf("%q for %s logged %d times, want once", ev, peer, n)
		}
	}
	for _, l := range logs.lines(t) {
		if err := uniqueKeys(l); err != nil {
			t.Errorf("log line %s: %v", l, err)
		}
	}
}

// uniqueKeys checks that a JSON object has no key twice at its top level.
func uniqueKeys(line string) error {
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		key := k.(string)
		if seen[key] {
			return fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
	}
	return nil
}
