package main

import (
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// lease get on a key whose value does not decode names the key, the
// value and what to do.
func TestLeaseGetGarbageNamesKeyAndValue(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg) // 10.244.9.0-24 holds "garbage"
	r := run(t, srv.Endpoint, "", "lease", "get", "10.244.9.0/24")
	want := "Error: /coreos.com/network/subnets/10.244.9.0-24 holds a value no host can use: invalid lease: value is not a JSON object; the value is \"garbage\": daemons skip it; remove it with `overlayd lease revoke 10.244.9.0/24`\n"
	if r.code != exitError || r.err != want {
		t.Errorf("lease get of a garbage value: %+v\nwant stderr %q", r, want)
	}
}

// revoke --dry-run says of the owner's liveness what lease list says:
// unknown for a lease without a node ID (flanneld's).
func TestRevokeDryRunAliveAsLeaseListSays(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	p := netip.MustParsePrefix("10.244.50.0/24")
	id, err := reg.Client().Grant(ctx(t), 3600)
	if err != nil {
		t.Fatal(err)
	}
	attrs := subnet.NewAttrs(netip.MustParseAddr("198.18.0.50"), subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 0, 0x50}), "", "")
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: p}, attrs, int64(id.ID)); err != nil {
		t.Fatal(err)
	}
	list := run(t, srv.Endpoint, "", "lease", "list", "-w", "simple")
	if f := row(t, list.out, p.String()); f[5] != "unknown" {
		t.Fatalf("lease list row %q, want ALIVE unknown", f)
	}
	r := run(t, srv.Endpoint, "", "lease", "revoke", p.String(), "--force", "--dry-run")
	if r.code != exitOK || r.out != "would revoke 10.244.50.0/24 (owner 198.18.0.50, alive unknown)\n" {
		t.Errorf("revoke --dry-run: %+v", r)
	}
}

// In -w simple a node ID that is literally "-" (anyone with write access
// to the prefix can store one) is quoted, so it does not read as a lease
// without a node ID, whose NODE is a bare "-"; revoke --dry-run too.
func TestSimpleTellsADashNodeFromNone(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	for _, tc := range []struct{ subnet, node, want string }{
		{"10.244.51.0/24", "-", `"-"`},
		{"10.244.52.0/24", "", "-"},
	} {
		id, err := reg.Client().Grant(ctx(t), 3600)
		if err != nil {
			t.Fatal(err)
		}
		attrs := subnet.NewAttrs(netip.MustParseAddr("198.18.0.51"), subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 0, 0x51}), tc.node, "")
		if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: netip.MustParsePrefix(tc.subnet)}, attrs, int64(id.ID)); err != nil {
			t.Fatal(err)
		}
		list := run(t, srv.Endpoint, "", "lease", "list", "-w", "simple")
		if f := row(t, list.out, tc.subnet); f[3] != tc.want {
			t.Errorf("lease list row %q: NODE %s, want %s", f, f[3], tc.want)
		}
		r := run(t, srv.Endpoint, "", "lease", "revoke", tc.subnet, "--force", "--dry-run", "-w", "simple")
		if f := strings.Fields(r.out); r.code != exitOK || len(f) != 7 || f[5] != tc.want {
			t.Errorf("revoke --dry-run -w simple: %+v, want node ID %s", r, tc.want)
		}
	}
}

// In an IPv6-only network lease list fills its address columns with the
// IPv6 values, the IPv6 VTEP MAC included, instead of a row of dashes.
func TestLeaseListIPv6OnlyShowsItsAddresses(t *testing.T) {
	srv, reg := cluster(t)
	cfg, err := reg.PutConfig(ctx(t), []byte(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`))
	if err != nil {
		t.Fatal(err)
	}
	h := etcdv3.Host{NodeID: "h6", Hostname: "h", PublicIPv6: netip.MustParseAddr("2001:db8::6"), BackendV6Data: leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 6, 6}),
		Previous: subnet.Subnets{IPv6: netip.MustParsePrefix("fd00:10:244:6::/64")}}
	if _, _, err := etcdv3.NewManager(reg.For(cfg), cfg, h, etcdv3.ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"lease", "list"}, {"lease", "get", "fd00:10:244:6::/64"}} {
		r := run(t, srv.Endpoint, "", args...)
		lines := strings.Split(strings.TrimSpace(r.out), "\n")
		if r.code != exitOK || len(lines) != 2 || !slices.Equal(strings.Fields(lines[0]), strings.Fields("SUBNET PUBLIC IPV6 VTEP MAC NODE TTL ALIVE STATE")) {
			t.Fatalf("%v: %+v", args, r)
		}
		if f := strings.Fields(lines[1]); !slices.Equal(slices.Concat(f[:4], f[5:]), []string{"fd00:10:244:6::/64", "2001:db8::6", "0e:00:00:00:06:06", "h6", "no", "leased"}) {
			t.Errorf("%v: row %q", args, f)
		}
	}
}

// status never shows a negative time left: a lease past the expiry the
// daemon last renewed to is said to have expired, with what to check.
func TestStatusSaysExpiredNotNegative(t *testing.T) {
	past := time.Now().Add(-36 * time.Second)
	addr := statusServer(t, daemon.Status{Node: "h1", Subnet: "10.244.7.0/24", LeaseExpires: &past, Ready: true})
	r := run(t, "", "", "status", "--health-addr", addr)
	if !regexp.MustCompile("10.244.7.0/24 \\(expired 3[6-9]s ago unless renewed since: check `overlayd lease get` and the daemon's etcd connection\\)").MatchString(r.out) || strings.Contains(r.out, "-3") {
		t.Errorf("status of an expired lease: %+v", r)
	}
}
