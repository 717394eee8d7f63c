package masq

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// trafficLab is one simulated dual-stack host with pods, in namespaces:
//
//	pod1 10.244.1.5/24 fd00:10:244:1::5/64 ── veth ── host 10.244.1.1/24 fd00:10:244:1::1/64 (local pod, "cni0")
//	pod2 10.244.2.5/24 fd00:10:244:2::5/64 ── veth ── host 10.244.2.1/24 fd00:10:244:2::1/64 (a second local subnet)
//	pod3 10.244.3.5/24 ── veth ── host "overlay.1" 10.244.1.0/32, route 10.244.3.0/24 dev overlay.1
//	pod3 fd00:10:244:3::5/64 ── veth ── host "overlay-v6.1" fd00:10:244:1::/128, route fd00:10:244:3::/64 dev overlay-v6.1
//	     (a pod on another host, behind the VXLAN devices: it reaches the
//	     cluster networks via our VTEP addresses, and nothing else)
//	outside 203.0.113.1/24 2001:db8:ff::1/64 ── veth ── host 203.0.113.2/24 2001:db8:ff::2/64
//	     (the world; routes the cluster networks via the host)
type trafficLab struct {
	host, pod1, pod2, pod3, outside netns.NsHandle
}

var (
	pod1IP    = netip.MustParseAddr("10.244.1.5")
	pod2IP    = netip.MustParseAddr("10.244.2.5")
	pod3IP    = netip.MustParseAddr("10.244.3.5")
	outsideIP = netip.MustParseAddr("203.0.113.1")
	hostUpIP  = netip.MustParseAddr("203.0.113.2")
	bridgeIP  = netip.MustParseAddr("10.244.1.1")
	vtepIP    = netip.MustParseAddr("10.244.1.0")

	pod1IP6    = netip.MustParseAddr("fd00:10:244:1::5")
	pod2IP6    = netip.MustParseAddr("fd00:10:244:2::5")
	pod3IP6    = netip.MustParseAddr("fd00:10:244:3::5")
	outsideIP6 = netip.MustParseAddr("2001:db8:ff::1")
	hostUpIP6  = netip.MustParseAddr("2001:db8:ff::2")
	bridgeIP6  = netip.MustParseAddr("fd00:10:244:1::1")
	vtepIP6    = netip.MustParseAddr("fd00:10:244:1::")
)

func newTrafficLab(t *testing.T) *trafficLab {
	t.Helper()
	l := &trafficLab{
		host:    newNS(t, "host"),
		pod1:    newNS(t, "pod1"),
		pod2:    newNS(t, "pod2"),
		pod3:    newNS(t, "pod3"),
		outside: newNS(t, "out"),
	}
	veth(t, l.host, "cni0", []string{"10.244.1.1/24", "fd00:10:244:1::1/64"}, l.pod1, "eth0", []string{"10.244.1.5/24", "fd00:10:244:1::5/64"})
	veth(t, l.host, "cni1", []string{"10.244.2.1/24", "fd00:10:244:2::1/64"}, l.pod2, "eth0", []string{"10.244.2.5/24", "fd00:10:244:2::5/64"})
	veth(t, l.host, "overlay.1", []string{"10.244.1.0/32"}, l.pod3, "eth0", []string{"10.244.3.5/24"})
	veth(t, l.host, "overlay-v6.1", []string{"fd00:10:244:1::/128"}, l.pod3, "eth1", []string{"fd00:10:244:3::5/64"})
	veth(t, l.host, "up0", []string{"203.0.113.2/24", "2001:db8:ff::2/64"}, l.outside, "eth0", []string{"203.0.113.1/24", "2001:db8:ff::1/64"})
	route(t, l.pod1, "0.0.0.0/0", bridgeIP, "eth0")
	route(t, l.pod1, "::/0", bridgeIP6, "eth0")
	route(t, l.pod2, "0.0.0.0/0", netip.MustParseAddr("10.244.2.1"), "eth0")
	route(t, l.pod2, "::/0", netip.MustParseAddr("fd00:10:244:2::1"), "eth0")
	// The remote pod reaches our subnets via our VTEP addresses, as its
	// host's VXLAN routes do; its host would send replies to the outside
	// out of its own uplink, so here it has no route to the outside at all.
	route(t, l.pod3, "10.244.1.0/24", vtepIP, "eth0")
	route(t, l.pod3, "fd00:10:244:1::/64", vtepIP6, "eth1")
	route(t, l.host, "10.244.3.0/24", netip.Addr{}, "overlay.1")
	route(t, l.host, "fd00:10:244:3::/64", netip.Addr{}, "overlay-v6.1")
	route(t, l.outside, "10.244.0.0/16", hostUpIP, "eth0")
	route(t, l.outside, "fd00:10:244::/48", hostUpIP6, "eth0")

	enableSysctl(t, l.host, "/proc/sys/net/ipv4/ip_forward")
	enableSysctl(t, l.host, "/proc/sys/net/ipv6/conf/all/forwarding")
	waitIPv6Ready(t, l.host, l.pod1, l.pod2, l.pod3, l.outside)
	return l
}

// flow is one TCP connection and the source address its server must see.
type flow struct {
	name     string
	from, to netns.NsHandle
	dst      netip.Addr
	wantSrc  netip.Addr
}

func checkFlows(t *testing.T, flows []flow) {
	t.Helper()
	for _, f := range flows {
		t.Run(f.name, func(t *testing.T) {
			src, err := observedSource(f.from, f.to, f.dst, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if src != f.wantSrc {
				t.Errorf("the server at %s saw source %s, want %s", f.dst, src, f.wantSrc)
			}
		})
	}
}

// masqueraded returns the flows of one family with our table for that
// family's network in place, the VXLAN device rule included.
func (l *trafficLab) masqueraded(v6 bool) []flow {
	if v6 {
		return []flow{
			{"IPv6 pod to outside is masqueraded", l.pod1, l.outside, outsideIP6, hostUpIP6},
			{"IPv6 pod to local pod keeps its source", l.pod1, l.pod2, pod2IP6, pod1IP6},
			{"IPv6 pod to remote pod keeps its source", l.pod1, l.pod3, pod3IP6, pod1IP6},
			{"IPv6 outside to local pod keeps its source", l.outside, l.pod1, pod1IP6, outsideIP6},
			{"IPv6 outside to remote pod is masqueraded to the VTEP address", l.outside, l.pod3, pod3IP6, vtepIP6},
			{"IPv6 host to local pod", l.host, l.pod1, pod1IP6, bridgeIP6},
			{"IPv6 host to remote pod", l.host, l.pod3, pod3IP6, vtepIP6},
		}
	}
	return []flow{
		{"pod to outside is masqueraded", l.pod1, l.outside, outsideIP, hostUpIP},
		{"pod to local pod keeps its source", l.pod1, l.pod2, pod2IP, pod1IP},
		{"pod to remote pod keeps its source", l.pod1, l.pod3, pod3IP, pod1IP},
		{"outside to local pod keeps its source", l.outside, l.pod1, pod1IP, outsideIP},
		{"outside to remote pod is masqueraded to the VTEP address", l.outside, l.pod3, pod3IP, vtepIP},
		// The host's own connections pick a source inside the network
		// (the bridge's or the VTEP's address): no NAT needed.
		{"host to local pod", l.host, l.pod1, pod1IP, bridgeIP},
		{"host to remote pod", l.host, l.pod3, pod3IP, vtepIP},
	}
}

// podToOutsideUnNATed is a pod's connection to the outside in one family
// when no rule of ours covers that family.
func (l *trafficLab) podToOutsideUnNATed(v6 bool) flow {
	if v6 {
		return flow{"IPv6 pod to outside is not NATed", l.pod1, l.outside, outsideIP6, pod1IP6}
	}
	return flow{"pod to outside is not NATed", l.pod1, l.outside, outsideIP, pod1IP}
}

func (l *trafficLab) newMasq(t *testing.T, network netip.Prefix, opts ...Option) *Masq {
	t.Helper()
	m, err := New(network, append([]Option{WithNetNS(l.host), WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// expectTimeout fails t unless a connection from to dst does not complete.
func expectTimeout(t *testing.T, from, to netns.NsHandle, dst netip.Addr, what string) {
	t.Helper()
	_, err := observedSource(from, to, dst, 750*time.Millisecond)
	var nerr net.Error
	if !errors.As(err, &nerr) || !nerr.Timeout() {
		t.Errorf("%s: %v, want a timeout", what, err)
	}
}

func TestTraffic(t *testing.T) {
	l := newTrafficLab(t)
	m := l.newMasq(t, clusterNet, WithOverlayDevice("overlay.1"))

	t.Run("without our table nothing is NATed", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(false), l.podToOutsideUnNATed(true)})
	})

	mustEnsure(t, m, true)
	t.Run("with our table", func(t *testing.T) {
		checkFlows(t, l.masqueraded(false))
	})
	t.Run("an IPv4-only table leaves IPv6 alone", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(true)})
		// Not masqueraded to the VTEP address, the remote pod's replies
		// have no way back.
		expectTimeout(t, l.outside, l.pod3, pod3IP6, "IPv6 outside to remote pod with an IPv4-only table")
	})

	t.Run("without the overlay device rule outside to remote pod breaks", func(t *testing.T) {
		// The remote pod's replies to the outside client have no way back
		// through this host: the connection never completes.
		noDev := l.newMasq(t, clusterNet)
		mustEnsure(t, noDev, true)
		expectTimeout(t, l.outside, l.pod3, pod3IP, "outside to remote pod without the device rule")
		mustEnsure(t, m, true)
		checkFlows(t, []flow{{"and with it, it works", l.outside, l.pod3, pod3IP, vtepIP}})
	})

	t.Run("a foreign forward drop is reported and drops pod traffic", func(t *testing.T) {
		addForwardDrop(t, l.host, nftables.TableFamilyINet, "foreign")
		drops, err := m.ForwardDrops()
		if err != nil {
			t.Fatal(err)
		}
		if len(drops) != 1 || drops[0] != "inet foreign forward" {
			t.Errorf("ForwardDrops = %q, want [inet foreign forward]", drops)
		}
		expectTimeout(t, l.pod1, l.outside, outsideIP, "pod to outside through a forward drop")
		c := nftConn(t, l.host)
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "foreign"})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if changed, err := m.Ensure(); err != nil || changed {
			t.Fatalf("Ensure = %v, %v: another table's chains are none of our business", changed, err)
		}
		checkFlows(t, []flow{{"pod to outside again", l.pod1, l.outside, outsideIP, hostUpIP}})
	})

	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	t.Run("after Remove nothing is NATed", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(false)})
	})
}

func TestTrafficIPv6Only(t *testing.T) {
	l := newTrafficLab(t)
	m := l.newMasq(t, clusterNetV6, WithIPv6OverlayDevice("overlay-v6.1"))

	t.Run("without our table nothing is NATed", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(true)})
	})
	mustEnsure(t, m, true)
	t.Run("with our table", func(t *testing.T) {
		checkFlows(t, l.masqueraded(true))
	})
	t.Run("an IPv6-only table leaves IPv4 alone", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(false)})
	})
	t.Run("without the overlay device rule outside to remote pod breaks", func(t *testing.T) {
		noDev := l.newMasq(t, clusterNetV6)
		mustEnsure(t, noDev, true)
		expectTimeout(t, l.outside, l.pod3, pod3IP6, "IPv6 outside to remote pod without the device rule")
		mustEnsure(t, m, true)
		checkFlows(t, []flow{{"and with it, it works", l.outside, l.pod3, pod3IP6, vtepIP6}})
	})
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	t.Run("after Remove nothing is NATed", func(t *testing.T) {
		checkFlows(t, []flow{l.podToOutsideUnNATed(true)})
	})
}

func TestTrafficDualStack(t *testing.T) {
	l := newTrafficLab(t)
	m := l.newMasq(t, clusterNet, dualStack...)
	mustEnsure(t, m, true)
	checkFlows(t, append(l.masqueraded(false), l.masqueraded(true)...))
}

// A host upgraded from the version before dual stack holds its family ip
// table. One Ensure replaces it with ours in one transaction: IPv4 pod
// traffic is masqueraded before, after, and (one transaction) at every
// moment in between; IPv6 pod traffic is masqueraded from then on.
func TestTrafficMigrationFromFamilyIP(t *testing.T) {
	l := newTrafficLab(t)
	installState(t, nftConn(t, l.host), previousState(clusterNet, "overlay.1"))
	t.Run("before: the previous version's table masquerades IPv4", func(t *testing.T) {
		checkFlows(t, []flow{
			{"pod to outside is masqueraded", l.pod1, l.outside, outsideIP, hostUpIP},
			{"outside to remote pod is masqueraded to the VTEP address", l.outside, l.pod3, pod3IP, vtepIP},
			l.podToOutsideUnNATed(true),
		})
	})
	m := l.newMasq(t, clusterNet, dualStack...)
	assertRules(t, m, goldenPrevious)
	assertMigrates(t, m, l.host, goldenDualStack)
	t.Run("after: our table masquerades both families", func(t *testing.T) {
		checkFlows(t, append(l.masqueraded(false), l.masqueraded(true)...))
	})
}
