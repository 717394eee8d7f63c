package delegate_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/delegate"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

const (
	testNetwork6 = "fd00:10:244::/48"
	testLease6   = "fd00:10:244:7::/64"
	testGateway6 = "fd00:10:244:7::1"
)

func (l *lab) writeDualStackLease(lease, lease6 string) {
	l.t.Helper()
	env := subnet.NewEnv(netip.MustParsePrefix(testNetwork), netip.MustParsePrefix(lease), testMTU, true).
		WithIPv6(netip.MustParsePrefix(testNetwork6), netip.MustParsePrefix(lease6))
	if err := subnet.WriteEnv(l.subnetFile, env); err != nil {
		l.t.Fatal(err)
	}
}

// On a dual-stack host a pod gets an address from each lease, a route to
// each cluster network through the bridge's gateway of that family, and
// is reachable over both; CHECK notices a change of either lease; DEL
// releases both addresses.
func TestIntegrationDualStack(t *testing.T) {
	l := newLab(t)
	l.writeDualStackLease(testLease, testLease6)
	list := l.conflist("1.1.0", nil)
	pod := testenv.NewNS(t)
	rt := rtOf("pod1", pod)
	res := l.mustAdd(list, rt)

	var v4, v6 netip.Addr
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		if a.Unmap().Is4() {
			v4 = a.Unmap()
		} else {
			v6 = a
		}
	}
	if !netip.MustParsePrefix(testLease).Contains(v4) || !netip.MustParsePrefix(testLease6).Contains(v6) || v6 == netip.MustParseAddr(testGateway6) {
		t.Fatalf("pod addresses %v, want one in %s and one in %s", res.IPs, testLease, testLease6)
	}
	routes := podRoutes6(t, pod)
	if want := testNetwork6 + " via " + testGateway6; !slices.Contains(routes, want) {
		t.Errorf("pod IPv6 routes %v lack %q", routes, want)
	}
	reserved := l.reservations()
	if reserved[v4.String()] != "pod1/eth0" || reserved[v6.String()] != "pod1/eth0" {
		t.Errorf("host-local reservations %v, want %s and %s for pod1/eth0", reserved, v4, v6)
	}
	if err := tcpReach(t, l.hostNS, pod, v4); err != nil {
		t.Errorf("pod unreachable from its host at %s: %v", v4, err)
	}
	// The gateway address bridge puts on cni0 is tentative until duplicate
	// address detection ends (one probe, one second, by default).
	const dadPeriod = time.Second
	testenv.Eventually(t, dadPeriod+testenv.Slack, "the pod reachable from its host over IPv6", func() error {
		return tcpReach(t, l.hostNS, pod, v6)
	})
	if err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, rt) }); err != nil {
		t.Errorf("CHECK of a healthy dual-stack pod: %v", err)
	}

	l.writeDualStackLease(testLease, "fd00:10:244:9::/64")
	err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, rt) })
	if code := codeOf(t, err); code != delegate.CodeLeaseChanged || !strings.Contains(err.Error(), "IPv6 lease changed from "+testLease6) {
		t.Errorf("CHECK after the IPv6 lease changed = %v, want code %d naming the IPv6 lease", err, delegate.CodeLeaseChanged)
	}
	l.mustDel(list, rt)
	if len(l.reservations()) != 0 || exists(l.cacheFile("pod1")) {
		t.Errorf("DEL left reservations %v or the cache entry", l.reservations())
	}
}

// podRoutes6 lists the pod's IPv6 routes through a gateway, "dst via gw".
func podRoutes6(t *testing.T, pod ns.NetNS) []string {
	t.Helper()
	var out []string
	err := pod.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		routes, err := netlink.RouteList(link, netlink.FAMILY_V6)
		for _, r := range routes {
			if r.Gw != nil && r.Dst != nil {
				out = append(out, r.Dst.String()+" via "+r.Gw.String())
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("list the pod's IPv6 routes: %v", err)
	}
	return out
}
