package etcdv3

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/subnet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A small IPv6 pool (16 subnets), so that hosts racing for free subnets
// collide often.
const dualNetwork = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/60","IPv6SubnetLen":64,"Backend":{"Type":"vxlan","VNI":1}}`

func dualHost(i int) Host {
	h := host(i)
	h.PublicIPv6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)})
	h.BackendV6Data = vxlanData(net.HardwareAddr{0x0e, 0, 0, 6, byte(i >> 8), byte(i)})
	return h
}

func dualAttrs(i int) subnet.LeaseAttrs {
	h := dualHost(i)
	return subnet.NewAttrs(h.PublicIP, subnet.DefaultBackendType, h.BackendData, h.NodeID, h.Hostname).WithIPv6(h.PublicIPv6, h.BackendV6Data)
}

func subnets(v4, v6 string) subnet.Subnets {
	s := subnet.Subnets{IPv4: netip.MustParsePrefix(v4)}
	if v6 != "" {
		s.IPv6 = netip.MustParsePrefix(v6)
	}
	return s
}

// A dual-stack host's lease names both subnets and says both addresses,
// in flannel's form, and the config's pools hold both.
func TestAcquireDualStack(t *testing.T) {
	f := newFixture(t, dualNetwork)
	l, _, err := f.manager(dualHost(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !f.cfg.Contains(l.Subnet) || !f.cfg.IPv6.Contains(l.IPv6Subnet) {
		t.Fatalf("lease %s is not in the pools", l.Subnets())
	}
	got, err := f.reg.Get(ctx(t), l.Subnets())
	if err != nil {
		t.Fatal(err)
	}
	if !subnet.SameAttrs(got.Attrs, dualAttrs(1)) {
		t.Errorf("stored value %+v, want %+v", got.Attrs, dualAttrs(1))
	}
	if _, v6, err := peers(f.cfg, got); err != nil || v6.Subnet != l.IPv6Subnet || v6.PublicIP != dualHost(1).PublicIPv6 {
		t.Errorf("the lease as a peer: IPv6 %+v, %v", v6, err)
	}
}

// One IPv4 subnet has one key: a create under another key form or another
// IPv6 half loses, and says it lost to another key.
func TestCreateExcludesEveryKeyOfTheIPv4Subnet(t *testing.T) {
	f := newFixture(t, dualNetwork)
	if _, err := f.reg.Create(ctx(t), subnets("10.244.7.0/24", ""), dualAttrs(1), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Create(ctx(t), subnets("10.244.7.0/24", "fd00:10:244:7::/64"), dualAttrs(2), 0); !errors.Is(err, ErrHeldElsewhere) {
		t.Errorf("dual-stack key on an IPv4-only key's subnet: %v, want ErrHeldElsewhere", err)
	}
	if _, err := f.reg.Create(ctx(t), subnets("10.244.8.0/24", "fd00:10:244:8::/64"), dualAttrs(3), 0); err != nil {
		t.Fatal(err)
	}
	for _, s := range []subnet.Subnets{subnets("10.244.8.0/24", ""), subnets("10.244.8.0/24", "fd00:10:244:9::/64")} {
		if _, err := f.reg.Create(ctx(t), s, dualAttrs(4), 0); !errors.Is(err, ErrHeldElsewhere) {
			t.Errorf("create %s beside 10.244.8.0/24&fd00:10:244:8::/64: %v, want ErrHeldElsewhere", s, err)
		}
	}
	if _, err := f.reg.Create(ctx(t), subnets("10.244.8.0/24", "fd00:10:244:8::/64"), dualAttrs(4), 0); !errors.Is(err, ErrTaken) || errors.Is(err, ErrHeldElsewhere) {
		t.Errorf("create of an existing key: %v, want ErrTaken (not elsewhere)", err)
	}
	if _, err := f.reg.Create(ctx(t), subnets("10.244.9.0/24", "fd00:10:244:8::/64"), dualAttrs(5), 0); !errors.Is(err, ErrHeldElsewhere) {
		t.Errorf("an IPv6 subnet held under another IPv4 subnet: %v, want ErrHeldElsewhere", err)
	}
	if _, err := f.reg.Get(ctx(t), subnets("10.244.9.0/24", "fd00:10:244:8::/64")); !errors.Is(err, ErrNotFound) {
		t.Errorf("the losing claim was not withdrawn: %v", err)
	}
}

// flannel races here; overlay must not: hosts claiming one IPv6 subnet
// under different IPv4 subnets at once, exactly one keeps it.
func TestRacingClaimsOfOneIPv6SubnetLeaveOne(t *testing.T) {
	f := newFixture(t, dualNetwork)
	const n = 8
	v6 := "fd00:10:244:5::/64"
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = f.reg.Create(ctx(t), subnets(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i), 0}), 24).String(), v6), dualAttrs(i), 0)
		})
	}
	close(start)
	wg.Wait()
	won := winners(t, errs, ErrHeldElsewhere)
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var holders []string
	for _, l := range snap.Leases {
		if l.IPv6Subnet == netip.MustParsePrefix(v6) {
			holders = append(holders, l.Key())
		}
	}
	if won != 1 || len(holders) != 1 {
		t.Fatalf("%d claims won, keys holding %s: %v; want exactly one", won, v6, holders)
	}
}

// Many dual-stack hosts starting at once get distinct subnets of both
// families, with a small IPv6 pool that makes them collide.
func TestConcurrentDualStackHostsGetDistinctSubnets(t *testing.T) {
	f := newFixture(t, dualNetwork)
	const n = 12 // most of the IPv6 pool (15 subnets between SubnetMin and SubnetMax)
	got := make([]subnet.Subnets, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := f.manager(dualHost(i), ManagerOptions{Rand: rand.New(rand.NewPCG(uint64(i), 3))})
			<-start
			l, _, err := m.Acquire(ctx(t))
			got[i], errs[i] = l.Subnets(), err
		})
	}
	close(start)
	wg.Wait()
	seen4, seen6 := map[netip.Prefix]int{}, map[netip.Prefix]int{}
	for i, s := range got {
		if errs[i] != nil {
			t.Fatalf("host %d: %v", i, errs[i])
		}
		if j, dup := seen4[s.IPv4]; dup {
			t.Errorf("hosts %d and %d share %s", j, i, s.IPv4)
		}
		if j, dup := seen6[s.IPv6]; dup {
			t.Errorf("hosts %d and %d share %s", j, i, s.IPv6)
		}
		seen4[s.IPv4], seen6[s.IPv6] = i, i
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Leases) != n {
		t.Errorf("etcd holds %d leases, want %d (a losing claim left behind?)", len(snap.Leases), n)
	}
}

// When the network starts carrying IPv6, a host's IPv4-only lease is
// replaced by a dual-stack key with the same IPv4 subnet and etcd lease
// (its pods keep their addresses); when it stops, the IPv6 half is dropped.
func TestAdoptRekeysForTheNetworksFamilies(t *testing.T) {
	f := newFixture(t, testNetwork)
	h := dualHost(1)
	m := f.manager(h, ManagerOptions{})
	first, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Created() {
		t.Errorf("the first Acquire claimed a free subnet, but Created is false")
	}
	if first.IPv6Subnet.IsValid() {
		t.Fatalf("IPv4-only network gave %s", first.Subnets())
	}

	dual, err := subnet.ParseConfig([]byte(dualNetwork))
	if err != nil {
		t.Fatal(err)
	}
	h.Previous = subnets("10.244.200.0/24", "fd00:10:244:3::/64") // the IPv6 half is free: reused
	m = NewManager(f.reg, dual, h, ManagerOptions{})
	second, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon releases a created lease if its start fails: a re-keyed
	// one is the lease the host held, whose IPv4 subnet its pods use.
	if m.Created() {
		t.Errorf("re-keying this host's lease for IPv6 counts as creating it")
	}
	if second.Subnet != first.Subnet || second.IPv6Subnet != h.Previous.IPv6 || second.EtcdLease != first.EtcdLease {
		t.Fatalf("after enabling IPv6: %s (etcd lease %x), want %s&%s (etcd lease %x)", second.Subnets(), second.EtcdLease, first.Subnet, h.Previous.IPv6, first.EtcdLease)
	}
	keys := f.leaseKeys(t)
	if len(keys) != 1 || keys[0] != second.Key() {
		t.Fatalf("keys after enabling IPv6: %v, want only %s", keys, second.Key())
	}

	m = f.manager(h, ManagerOptions{})
	third, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if m.Created() {
		t.Errorf("re-keying this host's lease without IPv6 counts as creating it")
	}
	if third.Subnets() != subnets(first.Subnet.String(), "") || third.Attrs.PublicIPv6 != "" {
		t.Fatalf("after disabling IPv6: %s %+v", third.Subnets(), third.Attrs)
	}
	if keys := f.leaseKeys(t); len(keys) != 1 || keys[0] != third.Key() {
		t.Fatalf("keys after disabling IPv6: %v, want only %s", keys, third.Key())
	}
}

// A re-key whose IPv6 half turns out to be another host's (claimed first
// under another IPv4 subnet: no transaction can see that) withdraws and
// puts the IPv4 lease it replaced back: the host keeps the subnet its
// pods' addresses are in.
func TestRekeyThatLosesItsIPv6HalfKeepsTheIPv4Lease(t *testing.T) {
	f := newFixture(t, testNetwork)
	mine, _, err := f.manager(dualHost(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Create(ctx(t), subnets("10.244.99.0/24", "fd00:10:244:3::/64"), dualAttrs(2), 0); err != nil {
		t.Fatal(err)
	}
	next := subnets(mine.Subnet.String(), "fd00:10:244:3::/64")
	_, err = f.reg.Rekey(ctx(t), mine, next, dualAttrs(1), mine.EtcdLease)
	if !errors.Is(err, ErrHeldElsewhere) {
		t.Fatalf("Rekey onto a held IPv6 subnet: %v, want ErrHeldElsewhere", err)
	}
	got, err := f.reg.Get(ctx(t), mine.Subnets())
	if err != nil || got.EtcdLease != mine.EtcdLease || !subnet.SameAttrs(got.Attrs, mine.Attrs) {
		t.Fatalf("the IPv4 lease after the lost re-key: %+v, %v; want it back as it was", got, err)
	}
	if keys := f.leaseKeys(t); len(keys) != 2 {
		t.Errorf("keys after the lost re-key: %v, want the restored lease and the other host's", keys)
	}
}

func (f *fixture) leaseKeys(t *testing.T) []string {
	t.Helper()
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, l := range snap.Leases {
		keys = append(keys, l.Key())
	}
	for _, inv := range snap.Invalid {
		keys = append(keys, strings.TrimPrefix(inv.Key, f.reg.SubnetsPrefix()))
	}
	return keys
}

// An IPv6-only network's leases live under subnets6/, keyed by the IPv6
// subnet alone, with only the IPv6 fields in the value; flannel's
// subnets/ stays empty.
func TestIPv6OnlyLeasesLiveUnderSubnets6(t *testing.T) {
	f := newFixture(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":1}}`)
	reg := f.reg.For(f.cfg)
	var got []subnet.Lease
	for i := range 3 {
		l, _, err := NewManager(reg, f.cfg, dualHost(i), ManagerOptions{}).Acquire(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	for i, l := range got {
		if l.Subnet.IsValid() || !f.cfg.IPv6.Contains(l.IPv6Subnet) || l.Attrs.PublicIP != "" || len(l.Attrs.BackendData) != 0 || l.Attrs.PublicIPv6 != dualHost(i).PublicIPv6.String() {
			t.Errorf("host %d's lease %s: %+v", i, l.Subnets(), l.Attrs)
		}
		if _, v6, err := peers(f.cfg, l); err != nil || v6.Subnet != l.IPv6Subnet {
			t.Errorf("host %d's lease as a peer: %+v, %v", i, v6, err)
		}
	}
	if got[0].IPv6Subnet == got[1].IPv6Subnet || got[1].IPv6Subnet == got[2].IPv6Subnet || got[0].IPv6Subnet == got[2].IPv6Subnet {
		t.Errorf("hosts share an IPv6 subnet: %v %v %v", got[0].Subnets(), got[1].Subnets(), got[2].Subnets())
	}
	resp, err := f.cli.Get(ctx(t), DefaultPrefix+"/subnets6/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var stored, want []string
	for _, kv := range resp.Kvs {
		stored = append(stored, string(kv.Key))
	}
	for _, l := range got {
		want = append(want, DefaultPrefix+"/subnets6/"+subnet.Key(l.IPv6Subnet))
	}
	// etcd returns keys in byte order, which is not the subnets' order.
	slices.Sort(stored)
	slices.Sort(want)
	if !slices.Equal(stored, want) {
		t.Fatalf("keys under subnets6/: %q, want %q", stored, want)
	}
	if snap, err := f.reg.List(ctx(t)); err != nil || len(snap.Leases)+len(snap.Invalid) != 0 {
		t.Errorf("flannel's subnets/ holds %+v, %v; want nothing", snap, err)
	}
	if l, err := reg.Lookup(ctx(t), got[1].IPv6Subnet); err != nil || l.Subnets() != got[1].Subnets() {
		t.Errorf("Lookup(%s) = %v, %v", got[1].IPv6Subnet, l.Subnets(), err)
	}
}

// An IPv6-only host (no IPv4 address at all) is named by its IPv6 address:
// a reservation made for that address is adopted, and its node ID claim
// refuses a clone at another address — with no IPv4 address to compare,
// every host looked like the claim's own previous process.
func TestIPv6OnlyHostIsKnownByItsIPv6Address(t *testing.T) {
	t.Parallel() // waits out a liveness TTL; it has its own etcd
	f := newFixture(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":1}}`)
	reg := f.reg.For(f.cfg)
	v6only := func(i int) Host {
		h := dualHost(i)
		h.PublicIP, h.BackendData = netip.Addr{}, nil
		return h
	}
	h := v6only(1)
	reserved := subnet.Subnets{IPv6: netip.MustParsePrefix("fd00:10:244:7::/64")}
	if _, err := reg.Create(ctx(t), reserved, subnet.LeaseAttrs{PublicIPv6: h.PublicIPv6.String()}, 0); err != nil {
		t.Fatal(err)
	}
	opts := ManagerOptions{LivenessTTL: 2 * time.Second}
	m := NewManager(reg, f.cfg, h, opts)
	if err := m.ClaimNodeID(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l, _, err := m.Acquire(ctx(t))
	if err != nil || l.Subnets() != reserved || !l.Reserved {
		t.Fatalf("Acquire = %v (reserved %v), %v; want the reservation %v", l.Subnets(), l.Reserved, err, reserved)
	}
	resp, err := f.cli.Get(ctx(t), f.reg.NodeKey(h.NodeID))
	if err != nil || len(resp.Kvs) != 1 || strings.Contains(string(resp.Kvs[0].Value), "invalid") {
		t.Fatalf("liveness key %v, %v; want one naming the host's addresses", resp.Kvs, err)
	}
	clone := v6only(2)
	clone.NodeID = h.NodeID
	err = NewManager(reg, f.cfg, clone, opts).ClaimNodeID(ctx(t))
	if !errors.Is(err, ErrDuplicateNode) || !strings.Contains(err.Error(), h.PublicIPv6.String()) {
		t.Fatalf("a clone's claim: %v; want ErrDuplicateNode naming %s", err, h.PublicIPv6)
	}
	// Its own next process is still welcome.
	if err := NewManager(reg, f.cfg, v6only(1), opts).ClaimNodeID(ctx(t)); err != nil {
		t.Fatalf("the same host's next claim: %v", err)
	}
}
