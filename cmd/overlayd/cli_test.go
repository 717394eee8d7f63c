package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

type cliResult struct {
	out, err string
	code     int
}

// run executes the CLI in-process against endpoint, in an environment
// without the caller's settings (testenv.ProgramEnv).
func run(t *testing.T, endpoint string, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	if endpoint != "" {
		args = append([]string{"--endpoints", endpoint, "--dial-timeout", "5s"}, args...)
	}
	code := executeEnv(args, testenv.ProgramEnv(), strings.NewReader(stdin), &out, &errOut)
	return cliResult{out.String(), errOut.String(), code}
}

func cluster(t *testing.T) (*etcdtest.Server, *etcdv3.Registry) {
	t.Helper()
	srv := etcdtest.Start(t)
	return srv, etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestConfigPutGetValidate(t *testing.T) {
	srv, _ := cluster(t)
	r := run(t, srv.Endpoint, "", "config", "get")
	if r.code != exitError || !strings.Contains(r.err, "no network config at /coreos.com/network/config") || !strings.Contains(r.err, "overlayd config put -f net.json") {
		t.Fatalf("get without config: %+v", r)
	}

	bad := run(t, srv.Endpoint, `{"Network":"10.244.0.0/16","SubnetLen":40}`, "config", "put", "-f", "-")
	if bad.code != exitError || !strings.Contains(bad.err, "SubnetLen 40") || !strings.Contains(bad.err, "nothing was stored") {
		t.Fatalf("put invalid: %+v", bad)
	}
	if r := run(t, srv.Endpoint, "", "config", "get"); r.code != exitError {
		t.Fatalf("an invalid config was stored: %+v", r)
	}

	file := filepath.Join(t.TempDir(), "net.json")
	stored := `{"Network":"10.50.0.0/16","Backend":{"Type":"vxlan","VNI":7},"Custom":"kept"}`
	if err := os.WriteFile(file, []byte(stored), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, srv.Endpoint, "", "config", "put", "-f", file); r.code != exitOK || !strings.Contains(r.out, "stored /coreos.com/network/config") {
		t.Fatalf("put: %+v", r)
	}
	r = run(t, srv.Endpoint, "", "config", "get")
	for _, want := range []string{"Network                10.50.0.0/16", "SubnetMin              10.50.1.0", "Backend.VNI            7"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("config get table lacks %q:\n%s", want, r.out)
		}
	}
	r = run(t, srv.Endpoint, "", "config", "get", "-w", "json")
	var eff struct {
		Network   string
		SubnetLen int
		Backend   struct{ VNI, Port int }
	}
	if err := json.Unmarshal([]byte(r.out), &eff); err != nil || eff.Network != "10.50.0.0/16" || eff.SubnetLen != 24 || eff.Backend.VNI != 7 || eff.Backend.Port != 8472 {
		t.Errorf("config get -w json = %q (%v)", r.out, err)
	}
	if r := run(t, srv.Endpoint, "", "config", "get", "--raw"); strings.TrimSpace(r.out) != stored {
		t.Errorf("config get --raw = %q, want the stored bytes with unknown fields", r.out)
	}
	// validate needs no etcd at all: one it cannot reach is a warning.
	if r := run(t, "http://127.0.0.1:1", `{"Network":"10.1.0.0/24"}`, "config", "validate", "-f", "-"); r.code != exitOK || !strings.Contains(r.out, "SubnetLen              26") ||
		!strings.Contains(r.err, "warning: the file is valid, but it was not checked against the cluster") {
		t.Errorf("validate: %+v", r)
	}
	// Dual-stack and IPv6-only configs are stored like any other.
	for _, cfg := range []string{`{"Network":"10.1.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:1::/48"}`,
		`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:1::/48"}`} {
		if r := run(t, srv.Endpoint, cfg, "config", "put", "-f", "-"); r.code != exitOK {
			t.Errorf("config put of %s: %+v", cfg, r)
		}
	}
}

// seed starts two live hosts, one dead host's lease, a reservation and a
// garbage key, and returns the live hosts' subnets.
func seed(t *testing.T, reg *etcdv3.Registry) (live []netip.Prefix, dead netip.Prefix) {
	t.Helper()
	cfg, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		h := etcdv3.Host{NodeID: "node-" + string(rune('0'+i)), Hostname: "h", PublicIP: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}),
			BackendData: leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 0, byte(i)}), Previous: subnet.Subnets{IPv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)}}
		m := etcdv3.NewManager(reg, cfg, h, etcdv3.ManagerOptions{})
		l, _, err := m.Acquire(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if i == 3 { // acquired but never run: no liveness key, like a dead host
			dead = l.Subnet
			continue
		}
		live = append(live, l.Subnet)
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, "liveness of "+h.NodeID, m.Alive)
	}
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.100.0/24")}, subnet.LeaseAttrs{PublicIP: "198.18.0.100", NodeID: "future"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client().Put(ctx(t), reg.Keys.SubnetsPrefix()+"10.244.9.0-24", "garbage"); err != nil {
		t.Fatal(err)
	}
	return live, dead
}

// waitFor waits for an etcd write or watch event to be seen: no timer in
// between, only scheduling.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, testenv.Slack, what, cond)
}

func TestLeaseListTableAndJSON(t *testing.T) {
	srv, reg := cluster(t)
	live, dead := seed(t, reg)

	r := run(t, srv.Endpoint, "", "lease", "list")
	if r.code != exitOK {
		t.Fatalf("lease list: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "SUBNET") {
		t.Fatalf("lease list table has %d lines, want header + 4:\n%s", len(lines), r.out)
	}
	wantRows := map[string][]string{
		live[0].String():  {"198.18.0.1", "0e:00:00:00:00:01", "node-1", "yes"},
		live[1].String():  {"198.18.0.2", "0e:00:00:00:00:02", "node-2", "yes"},
		dead.String():     {"198.18.0.3", "node-3", "no"},
		"10.244.100.0/24": {"198.18.0.100", "future", "reserved", "no"},
	}
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		want, ok := wantRows[fields[0]]
		if !ok {
			t.Errorf("unexpected row %q", line)
			continue
		}
		for _, w := range want {
			if !strings.Contains(line, w) {
				t.Errorf("row %q lacks %q", line, w)
			}
		}
	}
	if !strings.Contains(r.err, "warning: skipping /coreos.com/network/subnets/10.244.9.0-24") {
		t.Errorf("the garbage key was not reported on stderr: %q", r.err)
	}

	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "json")
	var doc struct {
		Revision int64
		Leases   []leaseRow
		Invalid  []invalidRow
	}
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatalf("lease list -w json: %v\n%s", err, r.out)
	}
	if len(doc.Leases) != 4 || len(doc.Invalid) != 1 || doc.Revision == 0 {
		t.Fatalf("json: %d leases, %d invalid, revision %d", len(doc.Leases), len(doc.Invalid), doc.Revision)
	}
	for _, l := range doc.Leases {
		switch {
		case l.Reserved && l.TTLSeconds != -1:
			t.Errorf("reservation %s has ttl %d", l.Subnet, l.TTLSeconds)
		case !l.Reserved && (l.TTLSeconds < 23*3600 || l.TTLSeconds > 24*3600):
			t.Errorf("lease %s has ttl %d, want about 24h", l.Subnet, l.TTLSeconds)
		}
	}

	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "simple")
	if n := len(strings.Split(strings.TrimSpace(r.out), "\n")); n != 4 || strings.Contains(r.out, "SUBNET") {
		t.Errorf("simple output has %d lines (want 4, no header):\n%s", n, r.out)
	}

	// A node ID anyone with etcd access could have written (a newline and
	// a terminal escape) stays one quoted cell of one row.
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.101.0/24")}, subnet.LeaseAttrs{PublicIP: "198.18.0.101", NodeID: "x\n\x1b[2J"}, 0); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"table", "simple"} {
		r = run(t, srv.Endpoint, "", "lease", "list", "-w", w)
		row := regexp.MustCompile(`(?m)^10\.244\.101\.0/24 .*$`).FindString(r.out)
		if !strings.Contains(row, `"x\n\x1b[2J"`) || strings.Contains(r.out, "\x1b") {
			t.Errorf("-w %s: the hostile node ID is not one quoted cell of its row %q:\n%q", w, row, r.out)
		}
	}
}

func TestLeaseGetReserveRevoke(t *testing.T) {
	srv, reg := cluster(t)
	live, dead := seed(t, reg)

	for _, arg := range []string{live[0].String(), subnet.Key(live[0])} {
		r := run(t, srv.Endpoint, "", "lease", "get", arg, "-w", "json")
		var row leaseRow
		if err := json.Unmarshal([]byte(r.out), &row); err != nil || row.Subnet != live[0].String() || row.Alive != "yes" {
			t.Errorf("lease get %s = %+v (%v)", arg, r, err)
		}
	}
	if r := run(t, srv.Endpoint, "", "lease", "get", "10.244.250.0/24"); r.code != exitError || !strings.Contains(r.err, "no such lease") {
		t.Errorf("get missing: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "get", "10.244.250.1/24"); r.code != exitUsage {
		t.Errorf("get with host bits: %+v, want usage error", r)
	}

	// reserve
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.50.0/24", "--public-ip", "198.18.0.50"); r.code != exitOK {
		t.Fatalf("reserve: %+v", r)
	}
	l, err := reg.Get(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.50.0/24")})
	if err != nil || !l.Reserved || l.Attrs.PublicIP != "198.18.0.50" {
		t.Fatalf("reservation = %+v, %v", l, err)
	}
	if r := run(t, srv.Endpoint, "", "lease", "reserve", live[0].String(), "--public-ip", "198.18.0.51"); r.code != exitError || !strings.Contains(r.err, "already leased") {
		t.Errorf("reserve taken: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.99.0.0/24", "--public-ip", "198.18.0.51"); r.code != exitError || !strings.Contains(r.err, "subnet 10.99.0.0/24 is outside Network 10.244.0.0/16") {
		t.Errorf("reserve outside: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.51.0/24"); r.code != exitUsage {
		t.Errorf("reserve without --public-ip: %+v", r)
	}

	// revoke: a live owner is refused, dry-run deletes nothing, --force deletes.
	r := run(t, srv.Endpoint, "", "lease", "revoke", live[0].String())
	if r.code != exitError || !strings.Contains(r.err, "is alive") || !strings.Contains(r.err, "--force") {
		t.Errorf("revoke live: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", live[0].String(), "--force", "--dry-run"); r.code != exitOK || !strings.Contains(r.out, "would revoke") {
		t.Errorf("dry-run: %+v", r)
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: live[0]}); err != nil {
		t.Fatalf("dry-run deleted the lease: %v", err)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", dead.String()); r.code != exitOK || !strings.Contains(r.out, "revoked "+dead.String()) {
		t.Errorf("revoke dead: %+v", r)
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: dead}); err == nil {
		t.Error("dead host's lease still present after revoke")
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", live[1].String(), "--force"); r.code != exitOK {
		t.Errorf("revoke --force: %+v", r)
	}
	// The live owner re-claims its subnet at once.
	waitFor(t, "the live owner to re-claim "+live[1].String(), func() bool {
		l, err := reg.Get(ctx(t), subnet.Subnets{IPv4: live[1]})
		return err == nil && l.Attrs.NodeID == "node-2"
	})
}

func TestEnvironmentMirrorsFlags(t *testing.T) {
	srv, reg := cluster(t)
	if _, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16"}`)); err != nil {
		t.Fatal(err)
	}
	env := testenv.ProgramEnv("OVERLAY_ENDPOINTS="+srv.Endpoint, "OVERLAY_WRITE_OUT=json")
	r := runEnv(t, env, "config", "get")
	if r.code != exitOK || !strings.Contains(r.out, `"Network": "10.244.0.0/16"`) {
		t.Fatalf("config get from env: %+v", r)
	}
	// A flag beats the environment.
	if r := runEnv(t, env, "config", "get", "-w", "simple"); strings.Contains(r.out, "{") {
		t.Errorf("-w simple did not override OVERLAY_WRITE_OUT: %q", r.out)
	}
	if r := runEnv(t, append(env, "OVERLAY_DIAL_TIMEOUT=soon"), "config", "get"); r.code != exitUsage || !strings.Contains(r.err, "OVERLAY_DIAL_TIMEOUT") {
		t.Errorf("bad env value: %+v", r)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{{"nope"}, {"lease"}, {"lease", "nope"}, {"lease", "get"}, {"--nope"}, {"config", "put"}, {"lease", "list", "-w", "yaml"}} {
		if r := run(t, "", "", args...); r.code != exitUsage || !strings.Contains(r.err, "Error:") {
			t.Errorf("overlayd %v: code %d, stderr %q; want usage error (2)", args, r.code, r.err)
		}
	}
	if r := run(t, "", "", "version"); r.code != exitOK || !strings.HasPrefix(r.out, "overlayd ") {
		t.Errorf("version: %+v", r)
	}
}

func TestUnreachableEtcdSaysWhatToCheck(t *testing.T) {
	r := run(t, "", "", "--endpoints", "http://127.0.0.1:1", "--dial-timeout", "300ms", "lease", "list")
	if r.code != exitError || !strings.Contains(r.err, "check --endpoints") {
		t.Errorf("unreachable etcd: %+v", r)
	}
}

func TestLeaseListIsInAddressOrder(t *testing.T) {
	srv, reg := cluster(t)
	if _, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16"}`)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"10.244.156.0/24", "10.244.42.0/24", "10.244.9.0/24"} {
		if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix(s)}, subnet.LeaseAttrs{PublicIP: "198.18.0.9"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := run(t, srv.Endpoint, "", "lease", "list", "-w", "simple")
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(r.out), "\n") {
		got = append(got, strings.Fields(line)[0])
	}
	if want := "10.244.9.0/24 10.244.42.0/24 10.244.156.0/24"; strings.Join(got, " ") != want {
		t.Errorf("lease list order = %v, want %s", got, want)
	}
}

// What `config get -w json` prints, `config put -f` stores back without
// losing a member: flannel's own (Backend.GBP, Backend.MacPrefix,
// EnableNFTables), unknown ones, and those of a family that is off.
func TestConfigGetJSONPutsBackEveryMember(t *testing.T) {
	srv, _ := cluster(t)
	stored := `{"Network":"10.50.0.0/16","SubnetLen":24,"EnableNFTables":true,"IPv6Network":"fd00:50::/48",` +
		`"Custom":{"list":[1,"two"],"nested":{"x":null}},` +
		`"Backend":{"Type":"vxlan","VNI":7,"Port":4789,"GBP":true,"MacPrefix":"0e:11","Learning":false,"Extension":"x"}}`
	if r := run(t, srv.Endpoint, stored, "config", "put", "-f", "-"); r.code != exitOK {
		t.Fatalf("put: %+v", r)
	}
	backup := run(t, srv.Endpoint, "", "config", "get", "-w", "json")
	if backup.code != exitOK {
		t.Fatalf("get -w json: %+v", backup)
	}
	// Restore the backup over another config, as after an accident.
	if r := run(t, srv.Endpoint, `{"Network":"10.50.0.0/16","Backend":{"VNI":7,"Port":4789}}`, "config", "put", "-f", "-"); r.code != exitOK {
		t.Fatalf("put other: %+v", r)
	}
	if r := run(t, srv.Endpoint, backup.out, "config", "put", "-f", "-"); r.code != exitOK {
		t.Fatalf("put the backup back: %+v", r)
	}
	raw := run(t, srv.Endpoint, "", "config", "get", "--raw")
	var want, got map[string]any
	if err := json.Unmarshal([]byte(stored), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(raw.out), &got); err != nil {
		t.Fatalf("stored %q: %v", raw.out, err)
	}
	// The backup adds the defaults it filled in, and nothing else changes.
	want["SubnetMin"], want["SubnetMax"] = "10.50.1.0", "10.50.255.0"
	want["Backend"].(map[string]any)["DirectRouting"] = false
	want["Backend"].(map[string]any)["MTU"] = 0.0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config after get -w json | put (-want +got):\n%s", diff)
	}
	// The table shows the members overlay keeps without acting on them.
	table := run(t, srv.Endpoint, "", "config", "get")
	for _, line := range []string{"EnableNFTables         true (kept, not used by overlay)", "Backend.GBP            true (kept, not used by overlay)", `Backend.MacPrefix      "0e:11" (kept`} {
		if !strings.Contains(table.out, line) {
			t.Errorf("config get lacks %q:\n%s", line, table.out)
		}
	}
}

// masquerade install --net-config-path takes kube mode's network config
// file instead of etcd's: a file it cannot use is an error naming the
// flag, the file and what is wrong, before nftables is touched.
func TestMasqueradeInstallRefusesABadNetConfigFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, content, want string }{
		{"missing", "", "--net-config-path: open " + filepath.Join(dir, "missing") + ": no such file or directory (the network config file of kube mode"},
		{"no-network", `{"Backend":{"Type":"vxlan"}}`, "--net-config-path " + filepath.Join(dir, "no-network") + ": "},
		{"not-json", `{"Network":`, "--net-config-path " + filepath.Join(dir, "not-json") + ": "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := run(t, "", "", "masquerade", "install", "--net-config-path", path)
			if r.code != exitError || !strings.Contains(r.err, tc.want) || r.out != "" {
				t.Errorf("masquerade install --net-config-path %s: %+v, want exit %d saying %q", tc.name, r, exitError, tc.want)
			}
		})
	}
}
