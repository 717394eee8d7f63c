package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/leaseadmin"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// The environment never sets a safety flag or another command's flag
// (issue 13 item 6: OVERLAY_FORCE=1 bypassed revoke's liveness check;
// OVERLAY_PUBLIC_IP from the daemon's env file leaked into lease reserve).
func TestEnvironmentNeverSetsSafetyOrForeignFlags(t *testing.T) {
	srv, reg := cluster(t)
	live, _ := seed(t, reg)
	environ := []string{"OVERLAY_ENDPOINTS=" + srv.Endpoint, "OVERLAY_FORCE=1", "OVERLAY_DRY_RUN=false", "OVERLAY_PUBLIC_IP=198.18.0.77", "OVERLAY_RAW=1"}

	r := runEnv(t, environ, "lease", "revoke", live[0].String(), "--dry-run")
	if r.code != exitError || !strings.Contains(r.err, "is alive") || strings.Contains(r.out, "would revoke") {
		t.Errorf("OVERLAY_FORCE=1 revoke --dry-run of a live lease: %+v; want the liveness refusal", r)
	}
	if !strings.Contains(r.err, "warning: ignoring OVERLAY_FORCE: --force is taken only from the command line") {
		t.Errorf("no warning about OVERLAY_FORCE: %q", r.err)
	}
	r = runEnv(t, environ, "lease", "reserve", "10.244.60.0/24")
	if r.code != exitUsage || !strings.Contains(r.err, "--public-ip is required") {
		t.Errorf("OVERLAY_PUBLIC_IP leaked into lease reserve: %+v", r)
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.60.0/24")}); err == nil {
		t.Error("a reservation was written from the environment")
	}
	r = runEnv(t, environ, "lease", "revoke", live[0].String())
	if r.code != exitError || !strings.Contains(r.err, "is alive") {
		t.Errorf("OVERLAY_FORCE=1 revoke of a live lease: %+v", r)
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: live[0]}); err != nil {
		t.Errorf("the live lease was revoked: %v", err)
	}
}

// lease reserve writes only what every daemon accepts (the same check,
// Config.CheckClaim, on the encoded value) and one lease per host
// (issue 13 item 3).
func TestReserveRefusesWhatDaemonsWouldSkip(t *testing.T) {
	srv, reg := cluster(t)
	live, dead := seed(t, reg)
	liveLease, err := reg.Get(ctx(t), subnet.Subnets{IPv4: live[0]})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unspecified", []string{"10.244.61.0/24", "--public-ip", "0.0.0.0"}, exitUsage, "--public-ip \"0.0.0.0\": 0.0.0.0 is the unspecified address"},
		{"multicast", []string{"10.244.61.0/24", "--public-ip", "224.0.0.1"}, exitUsage, "224.0.0.1 is a multicast address"},
		{"broadcast", []string{"10.244.61.0/24", "--public-ip", "255.255.255.255"}, exitUsage, "the broadcast address"},
		{"loopback", []string{"10.244.61.0/24", "--public-ip", "127.0.0.2"}, exitUsage, "a loopback address"},
		{"inside the network", []string{"10.244.61.0/24", "--public-ip", "10.244.3.3"}, exitError, "daemons would skip it: invalid lease: PublicIP 10.244.3.3 is inside the overlay network 10.244.0.0/16"},
		{"outside the network", []string{"10.99.0.0/24", "--public-ip", "198.18.0.61"}, exitError, "subnet 10.99.0.0/24 is outside Network 10.244.0.0/16"},
		{"wrong length", []string{"10.244.61.0/25", "--public-ip", "198.18.0.61"}, exitError, "subnet 10.244.61.0/25 is not a /24"},
		{"misaligned", []string{"10.244.61.7/24", "--public-ip", "198.18.0.61"}, exitUsage, "want a network address such as 10.244.61.0/24"},
		{"bad node name", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--node-name", "bad/name"}, exitUsage, `--node-name "bad/name": "bad/name" may hold only letters`},
		{"node holds a lease", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--node-name", "node-1"},
			exitError, "node node-1 already has " + live[0].String() + " (key /coreos.com/network/subnets/" + subnet.Key(live[0]) + ")"},
		{"public IP holds a lease", []string{"10.244.61.0/24", "--public-ip", liveLease.Attrs.PublicIP},
			exitError, "public IP " + liveLease.Attrs.PublicIP + " already has " + live[0].String()},
		{"node holds a reservation", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--node-name", "future"},
			exitError, "node future already has 10.244.100.0/24"},
		{"taken", []string{dead.String(), "--public-ip", "198.18.0.61"}, exitError, "it is already leased"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, srv.Endpoint, "", append([]string{"lease", "reserve"}, tt.args...)...)
			if r.code != tt.code || !strings.Contains(r.err, tt.want) {
				t.Errorf("lease reserve %v: exit %d, stderr %q; want exit %d and %q", tt.args, r.code, r.err, tt.code, tt.want)
			}
		})
	}
	snap, err := reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Leases) != 4 {
		t.Errorf("refused reservations were written: %d leases, want the 4 seeded", len(snap.Leases))
	}

	// A good one is written and reads back as a valid, unclaimed reservation.
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.61.0/24", "--public-ip", "198.18.0.61", "--node-name", "h61"); r.code != exitOK || r.out != "reserved 10.244.61.0/24 for node h61 (198.18.0.61)\n" {
		t.Fatalf("reserve: %+v", r)
	}
	l, err := reg.Get(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.61.0/24")})
	cfg, _, cerr := reg.GetConfig(ctx(t))
	if err != nil || cerr != nil || !l.Unclaimed() || cfg.CheckClaim(l, leasedata.Codec{VNI: cfg.Backend.VNI}) != nil {
		t.Fatalf("reservation read back: %+v, %v, %v", l, err, cerr)
	}
	// A second one for the same node is refused.
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.62.0/24", "--public-ip", "198.18.0.62", "--node-name", "h61"); r.code != exitError || !strings.Contains(r.err, "node h61 already has 10.244.61.0/24") {
		t.Errorf("second reservation for one node: %+v", r)
	}
}

func putConfig(t *testing.T, endpoint, config string, extra ...string) cliResult {
	t.Helper()
	return run(t, endpoint, config, append([]string{"config", "put", "-f", "-"}, extra...)...)
}

// config put refuses a change that strands leases unless --force, naming
// them; the stranded leases show as orphaned and can be revoked (issue 13
// item 5).
func TestConfigPutRefusesToStrandLeases(t *testing.T) {
	srv, reg := cluster(t)
	live, dead := seed(t, reg)
	const stored = `{"Network":"10.244.0.0/16"}`

	for _, tc := range []struct {
		name, config string
		n            int
		want         string
	}{
		{"new network", `{"Network":"10.50.0.0/16"}`, 4, "is outside Network 10.50.0.0/16"},
		{"longer subnets", `{"Network":"10.244.0.0/16","SubnetLen":25}`, 4, "is not a /25"},
		{"other VNI", `{"Network":"10.244.0.0/16","Backend":{"VNI":9}}`, 3, "its VNI 1 is not the network's Backend.VNI 9"},
		{"other port", `{"Network":"10.244.0.0/16","Backend":{"Port":4789}}`, 3, "its host sends VXLAN to port 8472, Backend.Port 4789"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := putConfig(t, srv.Endpoint, tc.config)
			if r.code != exitError || !strings.Contains(r.err, "refusing to store the config: it would strand") ||
				strings.Count(r.err, "stranded: ") != tc.n || !strings.Contains(r.err, tc.want) || !strings.Contains(r.err, "node node-1 (198.18.0.1)") {
				t.Errorf("config put %s: %+v; want %d stranded leases and %q", tc.config, r, tc.n, tc.want)
			}
			if r := run(t, srv.Endpoint, "", "config", "get", "--raw"); strings.TrimSpace(r.out) != stored {
				t.Errorf("the refused config was stored: %q", r.out)
			}
		})
	}
	// Changes that strand nothing are stored as before.
	if r := putConfig(t, srv.Endpoint, `{"Network":"10.244.0.0/16","Backend":{"MTU":1400}}`); r.code != exitOK || r.err != "" {
		t.Errorf("harmless change: %+v", r)
	}

	// --force stores it and says what it stranded.
	r := putConfig(t, srv.Endpoint, `{"Network":"10.50.0.0/16"}`, "--force")
	if r.code != exitOK || !strings.Contains(r.out, "stored /coreos.com/network/config") || !strings.Contains(r.err, "warning: stored with --force: 4 leases stranded") {
		t.Fatalf("config put --force: %+v", r)
	}
	// lease list shows them as orphaned.
	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "json")
	var doc struct{ Leases []leaseRow }
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatal(err)
	}
	for _, l := range doc.Leases {
		if l.State != leaseadmin.StateOrphaned || !strings.Contains(l.Problem, "is outside Network 10.50.0.0/16") {
			t.Errorf("lease %s: state %q (%s), want orphaned", l.Subnet, l.State, l.Problem)
		}
	}
	r = run(t, srv.Endpoint, "", "lease", "list")
	if !strings.Contains(r.out, "STATE") || !strings.Contains(r.out, "orphaned") ||
		!strings.Contains(r.err, "warning: "+dead.String()+" is orphaned: lease does not fit the network config: subnet "+dead.String()+" is outside Network 10.50.0.0/16: daemons skip it; remove it with `overlayd lease revoke "+dead.String()+"`") {
		t.Errorf("lease list after --force: %+v", r)
	}
	// The dead host's orphan goes without --force; a live host's only
	// lease still needs it, until that host holds a lease that fits.
	if r := run(t, srv.Endpoint, "", "lease", "revoke", dead.String()); r.code != exitOK {
		t.Errorf("revoke a dead host's orphan: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", live[0].String()); r.code != exitError || !strings.Contains(r.err, "is alive") {
		t.Errorf("revoke a live host's only lease: %+v", r)
	}
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.50.7.0/24")}, subnet.LeaseAttrs{PublicIP: "198.18.0.1", NodeID: "node-1"}, 0); err != nil {
		t.Fatal(err)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", live[0].String()); r.code != exitOK || !strings.Contains(r.out, "revoked "+live[0].String()) {
		t.Errorf("revoke a live host's replaced orphan: %+v", r)
	}
}

// Config errors name the JSON field and the expected type, never Go's
// types (issue 13 item 10).
func TestConfigErrorsSpeakJSON(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{`["10.244.0.0/16"]`, `invalid network config: want a JSON object, got ["10.244.0.0/16"]`},
		{`{"Network":"10.244.0.0/16","SubnetLen":"24"}`, `invalid network config: "SubnetLen": want a whole number such as 24, got "24"`},
		{`{"Network":"10.244.0.0/16","Backend":{"VNI":"1"}}`, `"Backend.VNI": want a whole number in 1..16777215, got "1"`},
	} {
		r := run(t, "", tc.config, "config", "validate", "-f", "-")
		if r.code != exitError || !strings.Contains(r.err, tc.want) || strings.Contains(r.err, "Go ") || strings.Contains(r.err, "rawConfig") {
			t.Errorf("config validate %s: %+v; want %q", tc.config, r, tc.want)
		}
	}
}

// A key whose value names no host (STATE invalid) is revoked without
// --force: nobody owns it.
func TestRevokeGarbageKey(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg) // 10.244.9.0-24 holds "garbage"
	if r := run(t, srv.Endpoint, "", "lease", "revoke", "10.244.9.0/24"); r.code != exitOK {
		t.Errorf("revoke garbage: %+v", r)
	}
	snap, err := reg.List(ctx(t))
	if err != nil || len(snap.Invalid) != 0 {
		t.Errorf("garbage key still there: %+v %v", snap.Invalid, err)
	}
}

// A value that decodes but names no usable host (PublicIP 0.0.0.0, no
// node ID) is invalid in lease list and revoked without --force.
func TestRevokeValueNamingNoHost(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	p := netip.MustParsePrefix("10.244.70.0/24")
	id, err := reg.Client().Grant(ctx(t), 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: p}, subnet.LeaseAttrs{PublicIP: "0.0.0.0"}, int64(id.ID)); err != nil {
		t.Fatal(err)
	}
	r := run(t, srv.Endpoint, "", "lease", "list")
	if !strings.Contains(r.err, "warning: 10.244.70.0/24 is invalid: invalid lease: PublicIP 0.0.0.0 is the unspecified address") {
		t.Errorf("lease list: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", p.String()); r.code != exitOK || r.out != "revoked 10.244.70.0/24 (owner 0.0.0.0)\n" {
		t.Errorf("revoke: %+v", r)
	}
}

// A second reservation for a live node (written before reserve refused
// them, issue 13 item 3) is unused: revoke removes it without --force,
// while the lease the node uses stays protected.
func TestRevokeUnusedSecondReservation(t *testing.T) {
	srv, reg := cluster(t)
	live, _ := seed(t, reg)
	extra := netip.MustParsePrefix("10.244.80.0/24")
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: extra}, subnet.LeaseAttrs{PublicIP: "198.18.0.1", NodeID: "node-1"}, 0); err != nil {
		t.Fatal(err)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", extra.String()); r.code != exitOK || !strings.Contains(r.out, "revoked 10.244.80.0/24 (owner node node-1 (198.18.0.1))") {
		t.Errorf("revoke the unused reservation: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", live[0].String()); r.code != exitError || !strings.Contains(r.err, "is alive") {
		t.Errorf("revoke the lease node-1 uses: %+v", r)
	}
}

// A lease's node ID, public address and key are anyone's with write access
// to etcd: messages show them as they are when they are what they claim to
// be, and quoted otherwise, so an escape sequence never reaches the terminal.
func TestOwnerFromEtcdIsShownSafely(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	p := netip.MustParsePrefix("10.244.70.0/24")
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: p}, subnet.LeaseAttrs{PublicIP: "198.18.0.70\x1b[31m", PublicIPv6: "fe80::1%\x1b[0m", NodeID: "ev\x1b[2Jil"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client().Put(ctx(t), reg.Keys.SubnetsPrefix()+"\x1b[2Jbad", "x"); err != nil {
		t.Fatal(err)
	}
	owner := `node "ev\x1b[2Jil" ("198.18.0.70\x1b[31m", "fe80::1%\x1b[0m")`
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"lease", "revoke", "--dry-run", p.String()}, "would revoke 10.244.70.0/24 (owner " + owner + ", alive no)"},
		{`{"Network":"10.50.0.0/16"}`, []string{"config", "put", "-f", "-"}, "stranded: 10.244.70.0/24 of " + owner + ": "},
		{"", []string{"lease", "list"}, `warning: skipping "/coreos.com/network/subnets/\x1b[2Jbad": `},
		{"", []string{"lease", "revoke", p.String()}, "revoked 10.244.70.0/24 (owner " + owner + ")"},
	} {
		r := run(t, srv.Endpoint, tc.stdin, tc.args...)
		if strings.Contains(r.out+r.err, "\x1b") || !strings.Contains(r.out+r.err, tc.want) {
			t.Errorf("overlayd %s: stdout %q, stderr %q; want %q and no escape", strings.Join(tc.args, " "), r.out, r.err, tc.want)
		}
	}
	// What is what it claims to be is shown as it is.
	if r := run(t, srv.Endpoint, "", "lease", "revoke", "--dry-run", "10.244.2.0/24"); !strings.Contains(r.err, "its owner node node-2 (198.18.0.2) is alive") {
		t.Errorf("revoke of a live lease: %+v", r)
	}
}

// config put and config validate (with --endpoints) refuse a network that
// holds the underlay address of a host with a lease, a reservation or a
// liveness key — --force does not override it — and a network that can
// never be a cluster network (issue 28 item 1: every host then skipped its
// own lease and reported ready).
func TestConfigRefusesANetworkHoldingTheHostsUnderlay(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg) // node-1, node-2 live at 198.18.0.1-2; a dead lease at .3; a reservation at .100
	const stored = `{"Network":"10.244.0.0/16"}`
	cli := reg.Client()
	// A host running, its lease not written yet; one with an IPv6 address;
	// an IPv6-only lease.
	for key, value := range map[string]string{
		reg.Keys.NodeKey("lonely"): `{"PublicIP":"203.0.113.5","Hostname":"lonely","Since":"2026-01-01T00:00:00Z"}`,
		reg.Keys.NodeKey("six"):    `{"PublicIP":"198.19.0.6","PublicIPv6":"2001:db8::6","Hostname":"six","Since":"2026-01-01T00:00:00Z"}`,
		reg.For(&subnet.Config{EnableIPv6: true}).Keys.SubnetsPrefix() + "fd00:10:244:9::-64": `{"PublicIPv6":"2001:db8:9::9","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:09"},"NodeID":"v6only"}`,
	} {
		if _, err := cli.Put(ctx(t), key, value); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, config string
		lines        []string // the "inside: " lines, in order
		want         string
	}{
		{"the leases' and the reservation's", `{"Network":"198.18.0.0/16"}`, []string{
			"inside: 198.18.0.1, inside Network 198.18.0.0/16, is the underlay address of node node-1 (198.18.0.1) (lease 10.244.1.0/24)",
			"inside: 198.18.0.2, inside Network 198.18.0.0/16, is the underlay address of node node-2 (198.18.0.2) (lease 10.244.2.0/24)",
			"inside: 198.18.0.3, inside Network 198.18.0.0/16, is the underlay address of node node-3 (198.18.0.3) (lease 10.244.3.0/24)",
			"inside: 198.18.0.100, inside Network 198.18.0.0/16, is the underlay address of node future (198.18.0.100) (lease 10.244.100.0/24)",
		}, "Network 198.18.0.0/16 holds 4 underlay addresses of hosts (listed above): every host would skip the leases of the hosts it holds"},
		{"a liveness key's", `{"Network":"203.0.113.0/24"}`, []string{
			"inside: 203.0.113.5, inside Network 203.0.113.0/24, is the underlay address of node lonely, running (liveness key /coreos.com/network/nodes/lonely)",
		}, "Network 203.0.113.0/24 holds a host's underlay address (listed above)"},
		{"a liveness key's IPv6", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"2001:db8::/64"}`, []string{
			"inside: 2001:db8::6, inside IPv6Network 2001:db8::/64, is the underlay address of node six, running (liveness key /coreos.com/network/nodes/six)",
		}, "IPv6Network 2001:db8::/64 holds a host's underlay address"},
		{"an IPv6-only lease's", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"2001:db8:9::/48"}`, []string{
			"inside: 2001:db8:9::9, inside IPv6Network 2001:db8:9::/48, is the underlay address of node v6only (2001:db8:9::9) (lease fd00:10:244:9::/64)",
		}, "IPv6Network 2001:db8:9::/48 holds a host's underlay address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{nil, {"--force"}} {
				r := putConfig(t, srv.Endpoint, tc.config, args...)
				if r.code != exitError || !strings.Contains(r.err, "Error: refusing to store the config: "+tc.want) ||
					!strings.HasSuffix(strings.TrimSpace(r.err), "(--force does not override this); nothing was stored") {
					t.Errorf("config put %v %s: %+v; want exit 1 with %q", args, tc.config, r, tc.want)
				}
				if got := insideLines(r.err); !slices.Equal(got, tc.lines) {
					t.Errorf("config put %v %s: lines\n%s\nwant\n%s", args, tc.config, strings.Join(got, "\n"), strings.Join(tc.lines, "\n"))
				}
			}
			if r := run(t, srv.Endpoint, "", "config", "get", "--raw"); strings.TrimSpace(r.out) != stored {
				t.Errorf("the refused config was stored: %q", r.out)
			}
			// validate checks against the cluster when given its endpoints...
			r := run(t, srv.Endpoint, tc.config, "config", "validate", "-f", "-")
			if r.code != exitError || !strings.Contains(r.err, "Error: the config does not fit the cluster at "+srv.Endpoint+": "+tc.want) ||
				!slices.Equal(insideLines(r.err), tc.lines) || r.out != "" {
				t.Errorf("config validate --endpoints: %+v; want exit 1 with %q", r, tc.want)
			}
			// ... and the file alone without them.
			if r := run(t, "", tc.config, "config", "validate", "-f", "-"); r.code != exitOK || r.err != "" {
				t.Errorf("config validate without --endpoints: %+v; want the file alone checked", r)
			}
		})
	}
	// A network holding none of them is checked and stored.
	if r := run(t, srv.Endpoint, `{"Network":"10.244.0.0/16","Backend":{"MTU":1400}}`, "config", "validate", "-f", "-"); r.code != exitOK || !strings.Contains(r.out, "Backend.MTU") {
		t.Errorf("config validate --endpoints of a fitting config: %+v", r)
	}
	if r := putConfig(t, srv.Endpoint, `{"Network":"10.244.0.0/16","Backend":{"MTU":1400}}`); r.code != exitOK {
		t.Errorf("config put of a fitting config: %+v", r)
	}
	// A range that can never be a cluster network, whatever the cluster.
	for _, cfg := range []string{`{"Network":"0.0.0.0/0"}`, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"::/0"}`} {
		r := putConfig(t, srv.Endpoint, cfg, "--force")
		if r.code != exitError || !strings.Contains(r.err, "is the default route") || !strings.Contains(r.err, "nothing was stored") {
			t.Errorf("config put --force %s: %+v", cfg, r)
		}
		if r := run(t, "", cfg, "config", "validate", "-f", "-"); r.code != exitError || !strings.Contains(r.err, "can never be a cluster network") {
			t.Errorf("config validate %s: %+v", cfg, r)
		}
	}
	// An etcd that cannot be reached: the file alone is checked, and a
	// warning says the cluster was not.
	var out, errOut bytes.Buffer
	code := executeEnv([]string{"--endpoints", "unix://" + filepath.Join(t.TempDir(), "none.sock"), "--dial-timeout", "500ms", "config", "validate", "-f", "-"},
		testenv.ProgramEnv(), strings.NewReader(`{"Network":"198.18.0.0/16"}`), &out, &errOut)
	if code != exitOK || !strings.Contains(errOut.String(), "warning: the file is valid, but it was not checked against the cluster: ") ||
		!strings.Contains(out.String(), "198.18.0.0/16") {
		t.Errorf("config validate against an unreachable etcd: exit %d, %q, %q", code, out.String(), errOut.String())
	}
}

// insideLines are the "inside: " lines of a command's standard error.
func insideLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "inside: ") {
			out = append(out, l)
		}
	}
	return out
}

// configuration.md quotes config put's refusal of a network holding the
// hosts' underlay, the range rule's error and validate's warning as the
// commands print them.
func TestConfigUnderlayRefusalIsDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	flat := strings.Join(strings.Fields(doc), " ") // quotes wrap across lines
	const cmdLine = "$ overlayd config put -f net-198.51.json\n"
	i := strings.Index(doc, cmdLine)
	if i < 0 {
		t.Fatalf("configuration.md no longer has the example %q", cmdLine)
	}
	example := doc[i+len(cmdLine):]
	example = example[:strings.Index(example, "```")]

	srv, reg := cluster(t)
	if _, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")},
		subnet.LeaseAttrs{PublicIP: "198.51.100.1", BackendType: "vxlan", BackendData: json.RawMessage(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}`), NodeID: "h1"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client().Put(ctx(t), reg.Keys.NodeKey("h9"), `{"PublicIP":"198.51.100.9","Hostname":"h9","Since":"2026-01-01T00:00:00Z"}`); err != nil {
		t.Fatal(err)
	}
	r := putConfig(t, srv.Endpoint, `{"Network":"198.51.0.0/16"}`)
	if r.code != exitError || r.out != "" || r.err != example {
		t.Errorf("config put prints\n%s\nconfiguration.md quotes\n%s", r.err, example)
	}
	_, perr := subnet.ParseConfig([]byte(`{"Network":"0.0.0.0/0"}`))
	for _, quote := range []string{perr.Error(), "warning: the file is valid, but it was not checked against the cluster: …",
		"Error: the config does not fit the cluster at <endpoints>: …"} {
		if !strings.Contains(flat, "`"+quote+"`") {
			t.Errorf("configuration.md does not quote %q", quote)
		}
	}
	r = run(t, srv.Endpoint, `{"Network":"198.51.0.0/16"}`, "config", "validate", "-f", "-")
	if !strings.Contains(r.err, "Error: the config does not fit the cluster at "+srv.Endpoint+": ") {
		t.Errorf("config validate: %+v", r)
	}
}

// lease reserve refuses a subnet outside SubnetMin..SubnetMax — the
// network's first subnet, which no host leases, and any other — unless
// --force (issue 28 item 11: it reserved the first subnet without a word).
func TestReserveRefusesSubnetsOutsideTheLeasedRange(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	reserve := func(args ...string) cliResult {
		return run(t, srv.Endpoint, "", append([]string{"lease", "reserve"}, args...)...)
	}
	r := reserve("10.244.0.0/24", "--public-ip", "198.18.0.70")
	if want := "Error: cannot reserve 10.244.0.0/24: 10.244.0.0/24 is the first subnet of 10.244.0.0/16, which no host leases (its address is the network's own; SubnetMin is 10.244.1.0): pick a /24 between SubnetMin 10.244.1.0 and SubnetMax 10.244.255.0, or pass --force to reserve it all the same\n"; r.code != exitError || r.err != want {
		t.Errorf("reserve the first subnet: %+v; want exit 1 and %q", r, want)
	}
	if doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "configuration.md")); err != nil ||
		!strings.Contains(string(doc), "$ overlayd lease reserve 10.244.0.0/24 --public-ip 198.18.0.70\n"+r.err) {
		t.Errorf("configuration.md does not quote the refusal of the first subnet (%v)", err)
	}
	if _, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16","SubnetMin":"10.244.10.0","SubnetMax":"10.244.200.0"}`)); err != nil {
		t.Fatal(err)
	}
	for sub, want := range map[string]string{
		"10.244.5.0/24":   "10.244.5.0/24 is below SubnetMin 10.244.10.0, outside the range hosts lease from: pick a /24 between SubnetMin 10.244.10.0 and SubnetMax 10.244.200.0, or pass --force",
		"10.244.201.0/24": "10.244.201.0/24 is above SubnetMax 10.244.200.0, outside the range hosts lease from",
		"10.244.0.0/24":   "10.244.0.0/24 is the first subnet of 10.244.0.0/16",
	} {
		if r := reserve(sub, "--public-ip", "198.18.0.70"); r.code != exitError || !strings.Contains(r.err, want) {
			t.Errorf("reserve %s: %+v; want %q", sub, r, want)
		}
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.0.0/24")}); err == nil {
		t.Fatal("a refused reservation was written")
	}
	// In the range: written, quietly.
	if r := reserve("10.244.10.0/24", "--public-ip", "198.18.0.71"); r.code != exitOK || r.err != "" {
		t.Errorf("reserve inside the range: %+v", r)
	}
	// --force writes it, saying what it is.
	r = reserve("10.244.0.0/24", "--public-ip", "198.18.0.70", "--force")
	if r.code != exitOK || r.out != "reserved 10.244.0.0/24 for 198.18.0.70\n" ||
		r.err != "warning: reserved with --force: 10.244.0.0/24 is the first subnet of 10.244.0.0/16, which no host leases (its address is the network's own; SubnetMin is 10.244.10.0)\n" {
		t.Errorf("reserve --force of the first subnet: %+v", r)
	}
	l, err := reg.Get(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.0.0/24")})
	cfg, _, cerr := reg.GetConfig(ctx(t))
	if err != nil || cerr != nil || !l.Unclaimed() || cfg.CheckClaim(l, leasedata.Codec{VNI: cfg.Backend.VNI}) != nil {
		t.Errorf("the forced reservation read back: %+v, %v, %v", l, err, cerr)
	}
	// --force is never taken from the environment.
	r = runEnv(t, []string{"OVERLAY_ENDPOINTS=" + srv.Endpoint, "OVERLAY_FORCE=true"}, "lease", "reserve", "10.244.201.0/24", "--public-ip", "198.18.0.72")
	if r.code != exitError || !strings.Contains(r.err, "is above SubnetMax") {
		t.Errorf("OVERLAY_FORCE=true reserve outside the range: %+v", r)
	}
}
