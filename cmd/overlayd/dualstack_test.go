package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/leaseadmin"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

const dualConfig = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`

// dualSeed is what seedDual wrote in a dual-stack network.
type dualSeed struct {
	live, dead subnet.Subnets // node-1's lease (its overlayd runs), node-2's (it does not)
	v4only     netip.Prefix   // an IPv4-only key left from before IPv6: orphaned
}

// seedDual stores a dual-stack config, a live and a dead host's
// dual-stack leases and an IPv4-only reservation of a host gone.
func seedDual(t *testing.T, reg *etcdv3.Registry) dualSeed {
	t.Helper()
	cfg, err := reg.PutConfig(ctx(t), []byte(dualConfig))
	if err != nil {
		t.Fatal(err)
	}
	var seed dualSeed
	for i := byte(1); i <= 2; i++ {
		h := etcdv3.Host{NodeID: "node-" + string(rune('0'+i)), Hostname: "h",
			PublicIP: netip.AddrFrom4([4]byte{198, 18, 0, i}), BackendData: leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 0, i}),
			PublicIPv6: netip.MustParseAddr("2001:db8::" + string(rune('0'+i))), BackendV6Data: leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 6, i}),
			Previous: subnet.Subnets{IPv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, i, 0}), 24),
				IPv6: netip.MustParsePrefix("fd00:10:244:" + string(rune('0'+i)) + "::/64")}}
		m := etcdv3.NewManager(reg, cfg, h, etcdv3.ManagerOptions{})
		l, _, err := m.Acquire(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if !l.IPv6Subnet.IsValid() {
			t.Fatalf("%s acquired %s in a dual-stack network", h.NodeID, l.Subnets())
		}
		if i == 2 { // acquired but never run: no liveness key, like a dead host
			seed.dead = l.Subnets()
			continue
		}
		seed.live = l.Subnets()
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, "liveness of "+h.NodeID, m.Alive)
	}
	seed.v4only = netip.MustParsePrefix("10.244.3.0/24")
	if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: seed.v4only}, subnet.LeaseAttrs{PublicIP: "198.18.0.3", NodeID: "gone"}, 0); err != nil {
		t.Fatal(err)
	}
	return seed
}

// row returns the table row whose first cell is subnet.
func row(t *testing.T, out, subnet string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == subnet {
			return f
		}
	}
	t.Fatalf("no row for %s in:\n%s", subnet, out)
	return nil
}

var dualHeader = strings.Fields(strings.Join(slices.Concat(leaseHeader, ipv6Header), " "))

// In a dual-stack network lease list shows each key's IPv6 subnet and
// public IPv6 in two more columns, after the seven it always had (whose
// places scripts rely on), and in JSON.
func TestLeaseListDualStack(t *testing.T) {
	srv, reg := cluster(t)
	seed := seedDual(t, reg)

	r := run(t, srv.Endpoint, "", "lease", "list")
	if r.code != exitOK {
		t.Fatalf("lease list: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 4 || !slices.Equal(strings.Fields(lines[0]), dualHeader) {
		t.Fatalf("lease list: want the header %q and 3 rows:\n%s", dualHeader, r.out)
	}
	live := row(t, r.out, seed.live.IPv4.String())
	if want := []string{seed.live.IPv4.String(), "198.18.0.1", "0e:00:00:00:00:01", "node-1", live[4], "yes", "leased", seed.live.IPv6.String(), "2001:db8::1", "0e:00:00:00:06:01"}; !slices.Equal(live, want) {
		t.Errorf("live host's row %q, want %q", live, want)
	}
	if dead := row(t, r.out, seed.dead.IPv4.String()); !slices.Equal(dead[5:], []string{"no", "leased", seed.dead.IPv6.String(), "2001:db8::2", "0e:00:00:00:06:02"}) {
		t.Errorf("dead host's row %q", dead)
	}
	// An IPv4-only reservation no host adopted yet: its host gains an
	// IPv6 subnet when it adopts it. Nothing is orphaned.
	if old := row(t, r.out, "10.244.3.0/24"); !slices.Equal(old[4:], []string{"reserved", "no", "reserved", "-", "-", "-"}) {
		t.Errorf("IPv4-only reservation's row %q, want it reserved with no IPv6 subnet", old)
	}
	if strings.Contains(r.err, "orphaned") || strings.Contains(r.err, "10.244.3.0/24") {
		t.Errorf("stderr %q, want nothing said of the reservation", r.err)
	}

	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "simple")
	if f := row(t, r.out, seed.live.IPv4.String()); len(f) != 10 || f[1] != "198.18.0.1" || f[7] != seed.live.IPv6.String() || f[8] != "2001:db8::1" || f[9] != "0e:00:00:00:06:01" {
		t.Errorf("-w simple row %q, want the 7 usual fields, then the IPv6 subnet, public IPv6 and IPv6 VTEP MAC", f)
	}

	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "json")
	var doc struct{ Leases []leaseRow }
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil || len(doc.Leases) != 3 {
		t.Fatalf("lease list -w json: %v\n%s", err, r.out)
	}
	want := leaseRow{Subnet: seed.live.IPv4.String(), IPv6Subnet: seed.live.IPv6.String(), PublicIP: "198.18.0.1", PublicIPv6: "2001:db8::1",
		VtepMAC: "0e:00:00:00:00:01", VtepMACv6: "0e:00:00:00:06:01", NodeID: "node-1", Alive: "yes", State: leaseadmin.StateLeased}
	got := doc.Leases[0] // address order: 10.244.1.0/24 first
	if got.Subnet != want.Subnet || got.IPv6Subnet != want.IPv6Subnet || got.PublicIPv6 != want.PublicIPv6 || got.VtepMACv6 != want.VtepMACv6 || got.State != want.State {
		t.Errorf("json lease %+v, want %+v", got, want)
	}
	// An IPv4-only key's object has no IPv6 fields at all.
	var raw struct{ Leases []map[string]any }
	if err := json.Unmarshal([]byte(r.out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, l := range raw.Leases {
		if _, ok := l["ipv6Subnet"]; ok != (l["subnet"] != "10.244.3.0/24") {
			t.Errorf("json lease %v: ipv6Subnet present %v", l, ok)
		}
	}
}

// An IPv4-only network's output is as before issue 16: seven columns, no
// IPv6 field in JSON. A dual-stack key there (left from a config that
// carried IPv6) is orphaned, and brings the IPv6 columns along so that
// lease list shows what it names.
func TestLeaseListIPv4NetworkWithDualKey(t *testing.T) {
	srv, reg := cluster(t)
	live, _ := seed(t, reg)
	r := run(t, srv.Endpoint, "", "lease", "list")
	if !slices.Equal(strings.Fields(strings.SplitN(r.out, "\n", 2)[0]), strings.Fields(strings.Join(leaseHeader, " "))) {
		t.Errorf("IPv4-only network: header %q, want %q", strings.SplitN(r.out, "\n", 2)[0], leaseHeader)
	}
	if r := run(t, srv.Endpoint, "", "lease", "list", "-w", "json"); strings.Contains(strings.ToLower(r.out), "ipv6") || strings.Contains(r.out, "V6") {
		t.Errorf("IPv4-only network: JSON names IPv6:\n%s", r.out)
	}

	// A host not restarted since IPv6 was turned off: daemons use the
	// IPv4 half of its key, which its host drops the IPv6 half of at its
	// restart.
	dual := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.70.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:70::/64")}
	if _, err := reg.Create(ctx(t), dual, subnet.LeaseAttrs{PublicIP: "198.18.0.70", PublicIPv6: "2001:db8::70", NodeID: "h70",
		BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:70"}`), BackendV6Data: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:70"}`)}, 0); err != nil {
		t.Fatal(err)
	}
	r = run(t, srv.Endpoint, "", "lease", "list")
	if !strings.HasPrefix(r.out, "SUBNET") || !slices.Equal(strings.Fields(strings.SplitN(r.out, "\n", 2)[0]), dualHeader) {
		t.Fatalf("header with a dual-stack key: %q, want %q", strings.SplitN(r.out, "\n", 2)[0], dualHeader)
	}
	if f := row(t, r.out, "10.244.70.0/24"); !slices.Equal(f[6:], []string{"ipv4-only", "fd00:10:244:70::/64", "2001:db8::70", "0e:00:00:00:06:70"}) {
		t.Errorf("dual-stack key's row %q, want it ipv4-only, with its IPv6 subnet and address", f)
	}
	if f := row(t, r.out, live[0].String()); !slices.Equal(f[6:], []string{"leased", "-", "-", "-"}) {
		t.Errorf("IPv4-only lease's row %q", f)
	}
	if want := "note: 10.244.70.0/24&fd00:10:244:70::/64 is ipv4-only: its key names the IPv6 subnet fd00:10:244:70::/64, but the network carries no IPv6 (its host has not restarted since): its IPv4 half is used; it drops the IPv6 subnet when its host restarts: nothing to revoke"; !strings.Contains(r.err, want) {
		t.Errorf("stderr %q lacks %q", r.err, want)
	}
	if strings.Contains(r.err, "warning: 10.244.70.0/24") {
		t.Errorf("stderr %q warns of a key in a roll of EnableIPv6", r.err)
	}
	// ... and revoke removes it without --force: h70 is not alive.
	if r := run(t, srv.Endpoint, "", "lease", "revoke", "fd00:10:244:70::/64"); r.code != exitOK || r.out != "revoked 10.244.70.0/24&fd00:10:244:70::/64 (owner node h70 (198.18.0.70, 2001:db8::70))\n" {
		t.Errorf("revoke the orphaned dual-stack key: %+v", r)
	}
}

// lease get finds a dual-stack lease by either subnet and shows both.
func TestLeaseGetDualStack(t *testing.T) {
	srv, reg := cluster(t)
	seed := seedDual(t, reg)
	for _, arg := range []string{seed.live.IPv4.String(), subnet.Key(seed.live.IPv4), seed.live.IPv6.String()} {
		r := run(t, srv.Endpoint, "", "lease", "get", arg, "-w", "json")
		var got leaseRow
		if err := json.Unmarshal([]byte(r.out), &got); err != nil || got.Subnet != seed.live.IPv4.String() || got.IPv6Subnet != seed.live.IPv6.String() ||
			got.PublicIPv6 != "2001:db8::1" || got.VtepMACv6 != "0e:00:00:00:06:01" || got.State != leaseadmin.StateLeased {
			t.Errorf("lease get %s -w json = %+v (%v)", arg, r, err)
		}
	}
	r := run(t, srv.Endpoint, "", "lease", "get", seed.live.IPv6.String())
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if r.code != exitOK || len(lines) != 2 || !slices.Equal(strings.Fields(lines[0]), dualHeader) || !strings.HasSuffix(lines[1], seed.live.IPv6.String()+"  2001:db8::1  0e:00:00:00:06:01") {
		t.Errorf("lease get %s: %+v", seed.live.IPv6, r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "get", "fd00:10:244:99::/64"); r.code != exitError || !strings.Contains(r.err, "no such lease") {
		t.Errorf("get a free IPv6 subnet: %+v", r)
	}
}

// lease reserve in a dual-stack network writes a key naming both subnets,
// checked as daemons check what they read, and refuses what they would
// skip or what another key holds (issue 16).
func TestReserveDualStack(t *testing.T) {
	srv, reg := cluster(t)
	seed := seedDual(t, reg)
	const noV6 = "the network carries IPv6 (EnableIPv6 in /coreos.com/network/config), so a reservation names the host's IPv6 subnet too (a reservation pins each subnet its host gets): add --ipv6-subnet (a /64 inside fd00:10:244::/56) and the host's --public-ipv6"
	const both = "give both --public-ip and --public-ipv6, or (if they are not known yet) --node-name alone"
	v6 := []string{"--ipv6-subnet", "fd00:10:244:61::/64", "--public-ipv6", "2001:db8::61"}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no IPv6 subnet", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61"}, exitError, noV6},
		{"node only, no IPv6 subnet", []string{"10.244.61.0/24", "--node-name", "h61"}, exitError, noV6},
		{"no public IPv6", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/64"}, exitError, both},
		{"no public IPv4", []string{"10.244.61.0/24", "--node-name", "h61", "--ipv6-subnet", "fd00:10:244:61::/64", "--public-ipv6", "2001:db8::61"}, exitError, both},
		{"no address, no node", append([]string{"10.244.61.0/24"}, v6...), exitError, "give both --public-ip and --public-ipv6"},
		{"IPv6 subnet as SUBNET", []string{"fd00:10:244:61::/64", "--public-ip", "198.18.0.61"}, exitError, "cannot reserve fd00:10:244:61::/64: the network carries IPv4: name the IPv4 subnet as SUBNET (and the IPv6 one with --ipv6-subnet)"},
		{"two IPv6 subnets", []string{"fd00:10:244:61::/64", "--ipv6-subnet", "fd00:10:244:62::/64", "--public-ip", "198.18.0.61"}, exitUsage, "subnet fd00:10:244:61::/64 is an IPv6 subnet: name the IPv4 subnet as SUBNET and the IPv6 one with --ipv6-subnet"},
		{"IPv6 subnet outside", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:99::/64", "--public-ipv6", "2001:db8::61"},
			exitError, "daemons would skip it: lease does not fit the network config: subnet fd00:99::/64 is outside IPv6Network fd00:10:244::/56: pick a /24 inside 10.244.0.0/16 and a /64 inside fd00:10:244::/56"},
		{"IPv6 subnet of another length", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/80", "--public-ipv6", "2001:db8::61"},
			exitError, "subnet fd00:10:244:61::/80 is not a /64"},
		{"public IPv6 inside the network", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/64", "--public-ipv6", "fd00:10:244:5::1"},
			exitError, "PublicIPv6 fd00:10:244:5::1 is inside the overlay network fd00:10:244::/56: pass the host's underlay addresses as --public-ip and --public-ipv6"},
		{"public IPv6 holds a lease", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/64", "--public-ipv6", "2001:db8::1"},
			exitError, "public IPv6 2001:db8::1 already has " + seed.live.String() + " (key /coreos.com/network/subnets/" + seed.live.Key() + ")"},
		{"IPv6 subnet held by another key", []string{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", seed.live.IPv6.String(), "--public-ipv6", "2001:db8::61"},
			exitError, seed.live.IPv6.String() + " is already held by key /coreos.com/network/subnets/" + seed.live.Key()},
		{"IPv4 subnet held by an IPv4-only key", append([]string{"10.244.3.0/24", "--public-ip", "198.18.0.61"}, v6...),
			exitError, "cannot reserve 10.244.3.0/24&fd00:10:244:61::/64: 10.244.3.0/24 is already held by key /coreos.com/network/subnets/10.244.3.0-24"},
		{"taken", []string{seed.dead.IPv4.String(), "--public-ip", "198.18.0.61", "--ipv6-subnet", seed.dead.IPv6.String(), "--public-ipv6", "2001:db8::61"},
			exitError, "it is already leased"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, srv.Endpoint, "", append([]string{"lease", "reserve"}, tt.args...)...)
			if r.code != tt.code || !strings.Contains(r.err, tt.want) {
				t.Errorf("lease reserve %v: exit %d, stderr %q; want exit %d and %q", tt.args, r.code, r.err, tt.code, tt.want)
			}
		})
	}
	if snap, err := reg.List(ctx(t)); err != nil || len(snap.Leases) != 3 {
		t.Fatalf("refused reservations were written: %d leases, want the 3 seeded (%v)", len(snap.Leases), err)
	}

	// A good one names both subnets and both addresses, and reads back as
	// a valid unclaimed reservation.
	r := run(t, srv.Endpoint, "", append([]string{"lease", "reserve", "10.244.61.0/24", "--public-ip", "198.18.0.61", "--node-name", "h61"}, v6...)...)
	if r.code != exitOK || r.out != "reserved 10.244.61.0/24&fd00:10:244:61::/64 for node h61 (198.18.0.61, 2001:db8::61)\n" {
		t.Fatalf("reserve: %+v", r)
	}
	s61 := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.61.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:61::/64")}
	checkReservation(t, reg, s61, "198.18.0.61", "2001:db8::61")
	// So does one naming only its node, whose addresses are not known yet.
	r = run(t, srv.Endpoint, "", "lease", "reserve", "10.244.62.0/24", "--ipv6-subnet", "fd00:10:244:62::/64", "--node-name", "h62")
	if r.code != exitOK || r.out != "reserved 10.244.62.0/24&fd00:10:244:62::/64 for node h62\n" {
		t.Fatalf("reserve by node name: %+v", r)
	}
	checkReservation(t, reg, subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.62.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:62::/64")}, "", "")
	r = run(t, srv.Endpoint, "", "lease", "list")
	if f := row(t, r.out, "10.244.62.0/24"); !slices.Equal(f[1:], []string{"-", "-", "h62", "reserved", "no", "reserved", "fd00:10:244:62::/64", "-", "-"}) {
		t.Errorf("node-only reservation's row %q", f)
	}
	// A second reservation of the same IPv6 subnet is refused (the
	// message configuration.md quotes).
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.63.0/24", "--ipv6-subnet", "fd00:10:244:61::/64", "--node-name", "h63"); r.code != exitError ||
		!strings.HasPrefix(r.err, "Error: cannot reserve 10.244.63.0/24&fd00:10:244:61::/64: fd00:10:244:61::/64 is already held by key /coreos.com/network/subnets/10.244.61.0-24&fd00:10:244:61::-64 (see `overlayd lease get fd00:10:244:61::/64`; revoke it first)\n") {
		t.Errorf("second reservation of an IPv6 subnet: %+v", r)
	}
}

// checkReservation reads s back and checks it is the unclaimed reservation
// every daemon accepts, with the public addresses given.
func checkReservation(t *testing.T, reg *etcdv3.Registry, s subnet.Subnets, publicIP, publicIPv6 string) {
	t.Helper()
	l, err := reg.Get(ctx(t), s)
	cfg, _, cerr := reg.GetConfig(ctx(t))
	if err != nil || cerr != nil || !l.Unclaimed() || cfg.CheckClaim(l, leasedata.Codec{VNI: cfg.Backend.VNI}) != nil || l.Attrs.PublicIP != publicIP || l.Attrs.PublicIPv6 != publicIPv6 {
		t.Fatalf("reservation %s read back: %+v, %v, %v", s, l, err, cerr)
	}
}

// In an IPv4-only network the IPv6 flags are refused, a reservation
// naming only its node works, and a dual-stack key holding the subnet
// (orphaned, but still there) is not shadowed by a second key.
func TestReserveIPv4NetworkRefusesIPv6(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	const drop = "the network carries no IPv6 (EnableIPv6 is false in /coreos.com/network/config): drop --ipv6-subnet and --public-ipv6"
	for _, args := range [][]string{
		{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/64", "--public-ipv6", "2001:db8::61"},
		{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--ipv6-subnet", "fd00:10:244:61::/64"},
		{"10.244.61.0/24", "--public-ip", "198.18.0.61", "--public-ipv6", "2001:db8::61"},
	} {
		if r := run(t, srv.Endpoint, "", append([]string{"lease", "reserve"}, args...)...); r.code != exitError || !strings.Contains(r.err, drop) {
			t.Errorf("lease reserve %v: %+v, want %q", args, r, drop)
		}
	}
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.61.0/24", "--node-name", "h61"); r.code != exitOK || r.out != "reserved 10.244.61.0/24 for node h61\n" {
		t.Errorf("reserve by node name: %+v", r)
	}
	checkReservation(t, reg, subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.61.0/24")}, "", "")

	dual := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.70.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:70::/64")}
	if _, err := reg.Create(ctx(t), dual, subnet.LeaseAttrs{PublicIP: "198.18.0.70", PublicIPv6: "2001:db8::70", NodeID: "h70"}, 0); err != nil {
		t.Fatal(err)
	}
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "10.244.70.0/24", "--public-ip", "198.18.0.71"); r.code != exitError ||
		!strings.Contains(r.err, "cannot reserve 10.244.70.0/24: 10.244.70.0/24 is already held by key /coreos.com/network/subnets/10.244.70.0-24&fd00:10:244:70::-64") {
		t.Errorf("reserve a subnet a dual-stack key holds: %+v", r)
	}
	if _, err := reg.Get(ctx(t), subnet.Subnets{IPv4: dual.IPv4}); err == nil {
		t.Error("a second key for 10.244.70.0/24 was written")
	}
}

// lease revoke finds a dual-stack lease by either subnet, names both, and
// guards a live owner's as an IPv4 one.
func TestRevokeDualStack(t *testing.T) {
	srv, reg := cluster(t)
	seed := seedDual(t, reg)

	if r := run(t, srv.Endpoint, "", "lease", "revoke", seed.live.IPv6.String()); r.code != exitError ||
		!strings.Contains(r.err, "refusing to revoke "+seed.live.String()+": its owner node node-1 (198.18.0.1, 2001:db8::1) is alive") {
		t.Errorf("revoke a live dual-stack lease by its IPv6 subnet: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", seed.live.IPv4.String(), "--force", "--dry-run"); r.code != exitOK ||
		r.out != "would revoke "+seed.live.String()+" (owner node node-1 (198.18.0.1, 2001:db8::1), alive yes)\n" {
		t.Errorf("revoke --force --dry-run: %+v", r)
	}
	if _, err := reg.Get(ctx(t), seed.live); err != nil {
		t.Fatalf("the live lease is gone: %v", err)
	}

	r := run(t, srv.Endpoint, "", "lease", "revoke", seed.dead.IPv6.String())
	if r.code != exitOK || r.out != "revoked "+seed.dead.String()+" (owner node node-2 (198.18.0.2, 2001:db8::2))\n" {
		t.Errorf("revoke a dead host's dual-stack lease by its IPv6 subnet: %+v", r)
	}
	if _, err := reg.Lookup(ctx(t), seed.dead.IPv4); err == nil {
		t.Error("the dead host's lease is still there")
	}
	// A free subnet of either family is not there to revoke, and saying
	// so is an error, not "revoked".
	for _, p := range []string{seed.dead.IPv6.String(), seed.dead.IPv4.String(), "10.244.250.0/24"} {
		if r := run(t, srv.Endpoint, "", "lease", "revoke", p); r.code != exitError || !strings.Contains(r.err, "no such lease") || r.out != "" {
			t.Errorf("revoke free %s: %+v", p, r)
		}
	}
	// The orphaned IPv4-only reservation of a host gone goes without --force.
	if r := run(t, srv.Endpoint, "", "lease", "revoke", seed.v4only.String()); r.code != exitOK || r.out != "revoked 10.244.3.0/24 (owner node gone (198.18.0.3))\n" {
		t.Errorf("revoke the orphaned IPv4-only key: %+v", r)
	}
}

// overlayd status shows a dual-stack host's IPv6 subnet, public IPv6 and
// IPv6 device beside their IPv4 rows.
func TestStatusDualStack(t *testing.T) {
	st := daemon.Status{
		Node: "h1", Iface: "eth0", PublicIP: "198.18.0.1", PublicIPv6: "2001:db8::1", Subnet: "10.244.7.0/24", IPv6Subnet: "fd00:10:244:7::/64",
		Device: "overlay.1", MTU: 1450, VtepMAC: "0e:00:00:00:00:01", DeviceV6: "overlay-v6.1", MTUv6: 1430, VtepMACv6: "0e:00:00:00:06:01",
		PeersExpected: 2, PeersProgrammed: 2, Ready: true, Conditions: []daemon.Condition{{Name: "device", OK: true}},
	}
	addr := statusServer(t, st)
	r := run(t, "", "", "status", "--health-addr", addr)
	want := "node          h1\n" +
		"public IP     198.18.0.1 (eth0)\n" +
		"public IPv6   2001:db8::1 (eth0)\n" +
		"subnet        10.244.7.0/24\n" +
		"IPv6 subnet   fd00:10:244:7::/64\n" +
		"device        overlay.1 mtu 1450 mac 0e:00:00:00:00:01\n" +
		"IPv6 device   overlay-v6.1 mtu 1430 mac 0e:00:00:00:06:01\n" +
		"peers         2 programmed / 2 expected\n" +
		"other leases  0 reserved, 0 orphaned, 0 invalid\n" +
		"ready         yes\n" +
		"  device      ok\n"
	if r.code != exitOK || r.out != want {
		t.Errorf("status of a dual-stack host:\n%s\nwant\n%s", r.out, want)
	}
	r = run(t, "", "", "status", "--health-addr", addr, "-w", "json")
	var got daemon.Status
	if err := json.Unmarshal([]byte(r.out), &got); err != nil || got.IPv6Subnet != st.IPv6Subnet || got.PublicIPv6 != st.PublicIPv6 ||
		got.DeviceV6 != st.DeviceV6 || got.MTUv6 != st.MTUv6 || got.VtepMACv6 != st.VtepMACv6 {
		t.Errorf("status -w json = %q (%v)", r.out, err)
	}

	// An IPv4-only host's status is as it always was: no IPv6 row.
	st.PublicIPv6, st.IPv6Subnet, st.DeviceV6, st.MTUv6, st.VtepMACv6 = "", "", "", 0, ""
	r = run(t, "", "", "status", "--health-addr", statusServer(t, st))
	want = "node          h1\n" +
		"public IP     198.18.0.1 (eth0)\n" +
		"subnet        10.244.7.0/24\n" +
		"device        overlay.1 mtu 1450 mac 0e:00:00:00:00:01\n" +
		"peers         2 programmed / 2 expected\n" +
		"other leases  0 reserved, 0 orphaned, 0 invalid\n" +
		"ready         yes\n" +
		"  device      ok\n"
	if r.code != exitOK || r.out != want {
		t.Errorf("status of an IPv4-only host:\n%s\nwant\n%s", r.out, want)
	}

	// An IPv6-only host shows its IPv6 rows alone, the lease's expiry on
	// its IPv6 subnet: no "subnet -", no IPv4 device of MTU 0.
	exp := time.Now().Add(24 * time.Hour)
	st = daemon.Status{
		Node: "h1", Iface: "eth0", PublicIPv6: "2001:db8::1", IPv6Subnet: "fd00:10:244:7::/64", LeaseExpires: &exp,
		DeviceV6: "overlay-v6.1", MTUv6: 1430, VtepMACv6: "0e:00:00:00:06:01",
		PeersExpected: 2, PeersProgrammed: 2, Ready: true, Conditions: []daemon.Condition{{Name: "device", OK: true}},
	}
	r = run(t, "", "", "status", "--health-addr", statusServer(t, st))
	if r.code != exitOK || !strings.HasPrefix(r.out, "node          h1\npublic IPv6   2001:db8::1 (eth0)\nIPv6 subnet   fd00:10:244:7::/64 (expires in ") ||
		!strings.Contains(r.out, "\nIPv6 device   overlay-v6.1 mtu 1430 mac 0e:00:00:00:06:01\npeers") {
		t.Errorf("status of an IPv6-only host:\n%s", r.out)
	}
}

// In an IPv6-only network the lease commands look under subnets6/, where
// its hosts keep their leases: list, get and revoke find them.
func TestLeaseCommandsIPv6Only(t *testing.T) {
	srv, reg := cluster(t)
	cfg, err := reg.PutConfig(ctx(t), []byte(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`))
	if err != nil {
		t.Fatal(err)
	}
	h := etcdv3.Host{NodeID: "h6", Hostname: "h", PublicIPv6: netip.MustParseAddr("2001:db8::6"), BackendV6Data: leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 6, 6}),
		Previous: subnet.Subnets{IPv6: netip.MustParsePrefix("fd00:10:244:6::/64")}}
	l, _, err := etcdv3.NewManager(reg.For(cfg), cfg, h, etcdv3.ManagerOptions{}).Acquire(ctx(t))
	if err != nil || l.Subnets() != h.Previous {
		t.Fatalf("Acquire = %s, %v; want %s", l.Subnets(), err, h.Previous)
	}
	r := run(t, srv.Endpoint, "", "lease", "list", "-w", "json")
	var list struct {
		Leases []struct {
			IPv6Subnet, PublicIPv6, State string
		} `json:"leases"`
	}
	if err := json.Unmarshal([]byte(r.out), &list); err != nil || len(list.Leases) != 1 ||
		list.Leases[0].IPv6Subnet != "fd00:10:244:6::/64" || list.Leases[0].PublicIPv6 != "2001:db8::6" || list.Leases[0].State != "leased" {
		t.Fatalf("lease list in an IPv6-only network: %+v (%v)\n%s", list, err, r.out)
	}
	if r := run(t, srv.Endpoint, "", "lease", "get", "fd00:10:244:6::/64"); r.code != exitOK || !strings.Contains(r.out, "2001:db8::6") {
		t.Errorf("lease get: %+v", r)
	}
	if r := run(t, srv.Endpoint, "", "lease", "revoke", "fd00:10:244:6::/64", "--force"); r.code != exitOK || !strings.Contains(r.out, "revoked fd00:10:244:6::/64") {
		t.Errorf("lease revoke: %+v", r)
	}
	if _, err := reg.For(cfg).Get(ctx(t), h.Previous); !errors.Is(err, etcdv3.ErrNotFound) {
		t.Errorf("after revoke: %v, want ErrNotFound", err)
	}
	// reserve names the IPv6 subnet as SUBNET, the host by --public-ipv6.
	if r := run(t, srv.Endpoint, "", "lease", "reserve", "fd00:10:244:9::/64", "--public-ipv6", "2001:db8::9", "--node-name", "h9"); r.code != exitOK || r.out != "reserved fd00:10:244:9::/64 for node h9 (2001:db8::9)\n" {
		t.Errorf("lease reserve: %+v", r)
	}
	res, err := reg.For(cfg).Get(ctx(t), subnet.Subnets{IPv6: netip.MustParsePrefix("fd00:10:244:9::/64")})
	if err != nil || !res.Reserved || cfg.CheckClaim(res, leasedata.Codec{VNI: cfg.Backend.VNI}) != nil {
		t.Errorf("the reservation: %+v, %v (CheckClaim %v)", res, err, cfg.CheckClaim(res, leasedata.Codec{VNI: cfg.Backend.VNI}))
	}
	for _, args := range [][]string{
		{"10.244.9.0/24", "--public-ip", "198.18.0.9"},
		{"fd00:10:244:a::/64", "--public-ip", "198.18.0.10", "--public-ipv6", "2001:db8::a"},
	} {
		if r := run(t, srv.Endpoint, "", append([]string{"lease", "reserve"}, args...)...); r.code != exitError || !strings.Contains(r.err, "the network carries no IPv4") {
			t.Errorf("reserve %v in an IPv6-only network: %+v", args, r)
		}
	}
}

// The config table shows the families the network carries, with the IPv6
// pool's fields when it carries IPv6 — in validate, put and get alike.
func TestConfigTableByFamily(t *testing.T) {
	backend := "Backend.Type vxlan|Backend.VNI 1|Backend.Port 8472|Backend.DirectRouting false|Backend.MTU 0 (underlay MTU - 50)"
	v4 := "Network 10.1.0.0/16|SubnetLen 24|SubnetMin 10.1.1.0|SubnetMax 10.1.255.0|Subnets 255|"
	v6 := "EnableIPv6 true|IPv6Network fd00:1::/48|IPv6SubnetLen 64|IPv6SubnetMin fd00:1:0:1::|IPv6SubnetMax fd00:1:0:ffff::|IPv6Subnets 65535|"
	for _, tc := range []struct{ name, config, want string }{
		{"IPv4-only", `{"Network":"10.1.0.0/16"}`, v4 + backend},
		{"IPv6-only", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:1::/48"}`, "EnableIPv4 false|" + v6 + backend},
		{"dual-stack", `{"Network":"10.1.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:1::/48"}`, v4 + v6 + backend},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := cluster(t)
			for _, args := range [][]string{{"config", "validate", "-f", "-"}, {"config", "put", "-f", "-"}, {"config", "get"}} {
				r := run(t, srv.Endpoint, tc.config, args...)
				if r.code != exitOK {
					t.Fatalf("%s: %+v", strings.Join(args, " "), r)
				}
				var rows []string
				for _, line := range strings.Split(strings.TrimSpace(r.out), "\n") {
					if f := strings.Fields(line); len(f) > 0 && f[0] != "FIELD" && f[0] != "stored" {
						rows = append(rows, strings.Join(f, " "))
					}
				}
				if got := strings.Join(rows, "|"); got != tc.want {
					t.Errorf("%s table rows:\n got %s\nwant %s", strings.Join(args, " "), got, tc.want)
				}
			}
		})
	}
}

// Turning IPv6 on or off (the IPv4 network unchanged) strands no lease:
// config put stores it without --force and says what to do (restart host
// by host; nothing to revoke); lease list shows the keys of hosts not yet
// restarted as ipv4-only. A change that re-addresses pods is refused as
// before, the IPv6 network's included.
func TestConfigPutIPv6Toggle(t *testing.T) {
	srv, reg := cluster(t)
	live, _ := seed(t, reg) // IPv4-only leases in {"Network":"10.244.0.0/16"}
	const (
		on  = "note: EnableIPv6 false -> true: restart overlayd host by host (each host needs a global IPv6 address on its underlay, or --public-ipv6); each host's lease gains an IPv6 subnet of fd00:10:244::/56 when it restarts, keeping its IPv4 subnet. IPv4 keeps flowing meanwhile; `overlayd lease list` shows the leases of hosts not yet restarted as ipv4-only. Nothing to revoke\n"
		off = "note: EnableIPv6 true -> false: restart overlayd host by host; each host drops its lease's IPv6 subnet and removes its IPv6 device when it restarts, keeping its IPv4 subnet. IPv4 keeps flowing meanwhile; `overlayd lease list` shows the leases of hosts not yet restarted as ipv4-only. Nothing to revoke\n"
	)
	r := putConfig(t, srv.Endpoint, dualConfig)
	if r.code != exitOK || r.err != on || !strings.Contains(r.out, "stored /coreos.com/network/config") {
		t.Fatalf("config put turning IPv6 on: %+v, want it stored with the note %q", r, on)
	}
	r = run(t, srv.Endpoint, "", "lease", "list", "-w", "json")
	var doc struct{ Leases []leaseRow }
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil {
		t.Fatal(err)
	}
	for _, l := range doc.Leases {
		if l.Subnet == live[0].String() && (l.State != leaseadmin.StateIPv4Only || !strings.Contains(l.Problem, "its key names no IPv6 subnet")) {
			t.Errorf("lease %s after IPv6 was turned on: state %q (%s), want ipv4-only", l.Subnet, l.State, l.Problem)
		}
		if l.State == leaseadmin.StateOrphaned {
			t.Errorf("lease %s orphaned by turning IPv6 on: %s", l.Subnet, l.Problem)
		}
	}
	// The table's note, as configuration.md quotes it (for 10.244.3.0/24).
	r = run(t, srv.Endpoint, "", "lease", "list")
	note := "note: " + live[0].String() + " is ipv4-only: its key names no IPv6 subnet (its host has not restarted since the network started carrying IPv6): its IPv4 half is used; it gains an IPv6 subnet when its host restarts: nothing to revoke"
	if !strings.Contains(r.err, note+"\n") {
		t.Errorf("lease list stderr %q lacks %q", r.err, note)
	}
	confDoc, err := os.ReadFile("../../Documentation/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if quote := strings.Replace(note, live[0].String(), "10.244.3.0/24", 1); !strings.Contains(string(confDoc), "\n"+quote+"\n") {
		t.Errorf("configuration.md does not quote %q", quote)
	}
	flat := strings.Join(strings.Fields(string(confDoc)), " ")
	if !strings.Contains(flat, strings.TrimSuffix(on, "\n")) || !strings.Contains(flat, strings.TrimSuffix(strings.TrimPrefix(off, "note: "), "\n")) {
		t.Errorf("configuration.md does not quote the notes of config put")
	}
	// Another IPv6 network would re-address the IPv6 pods of a dual-stack
	// lease: refused.
	dual := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.70.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:70::/64")}
	if _, err := reg.Create(ctx(t), dual, subnet.LeaseAttrs{PublicIP: "198.18.0.70", PublicIPv6: "2001:db8::70", NodeID: "h70",
		BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:70"}`), BackendV6Data: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:70"}`)}, 0); err != nil {
		t.Fatal(err)
	}
	if r := putConfig(t, srv.Endpoint, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:99::/56"}`); r.code != exitError ||
		!strings.Contains(r.err, "stranded: 10.244.70.0/24&fd00:10:244:70::/64 of node h70") || strings.Contains(r.err, "note:") {
		t.Errorf("config put of another IPv6 network: %+v, want it refused", r)
	}
	// Off again, and IPv6 on with another IPv4 network: the latter strands.
	if r := putConfig(t, srv.Endpoint, `{"Network":"10.244.0.0/16"}`); r.code != exitOK || r.err != off {
		t.Errorf("config put turning IPv6 off: %+v, want it stored with the note %q", r, off)
	}
	if r := putConfig(t, srv.Endpoint, `{"Network":"10.50.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`); r.code != exitError ||
		!strings.Contains(r.err, "refusing to store the config: it would strand") || strings.Contains(r.err, "note:") {
		t.Errorf("config put of IPv6 on and another Network: %+v, want it refused", r)
	}
}
