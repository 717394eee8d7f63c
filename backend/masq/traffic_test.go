package masq

import (
	"errors"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

const ipForward = "/proc/sys/net/ipv4/ip_forward"

// trafficLab is one simulated host with pods, in namespaces:
//
//	pod1 10.244.1.5/24 ── veth ── host 10.244.1.1/24  (local pod, "cni0")
//	pod2 10.244.2.5/24 ── veth ── host 10.244.2.1/24  (a second local subnet)
//	pod3 10.244.3.5/24 ── veth ── host "overlay.1" 10.244.1.0/32, route 10.244.3.0/24 dev overlay.1
//	     (a pod on another host, behind the VXLAN device: it reaches the
//	     cluster network via our VTEP address, and nothing else)
//	outside 203.0.113.1/24 ── veth ── host 203.0.113.2/24 (the world; routes 10.244.0.0/16 via the host)
type trafficLab struct {
	host, pod1, pod2, pod3, outside netns.NsHandle
}

var (
	pod1IP    = netip.MustParseAddr("10.244.1.5")
	pod2IP    = netip.MustParseAddr("10.244.2.5")
	pod3IP    = netip.MustParseAddr("10.244.3.5")
	outsideIP = netip.MustParseAddr("203.0.113.1")
	hostUpIP  = netip.MustParseAddr("203.0.113.2")
	vtepIP    = netip.MustParseAddr("10.244.1.0")
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
	veth(t, l.host, "cni0", []string{"10.244.1.1/24"}, l.pod1, "eth0", []string{"10.244.1.5/24"})
	veth(t, l.host, "cni1", []string{"10.244.2.1/24"}, l.pod2, "eth0", []string{"10.244.2.5/24"})
	veth(t, l.host, "overlay.1", []string{"10.244.1.0/32"}, l.pod3, "eth0", []string{"10.244.3.5/24"})
	veth(t, l.host, "up0", []string{"203.0.113.2/24"}, l.outside, "eth0", []string{"203.0.113.1/24"})
	route(t, l.pod1, "0.0.0.0/0", netip.MustParseAddr("10.244.1.1"), "eth0")
	route(t, l.pod2, "0.0.0.0/0", netip.MustParseAddr("10.244.2.1"), "eth0")
	// The remote pod reaches our subnet via our VTEP address, as its host's
	// VXLAN route does; its host would send replies to the outside out of
	// its own uplink, so here it has no route to the outside at all.
	route(t, l.pod3, "10.244.1.0/24", vtepIP, "eth0")
	route(t, l.host, "10.244.3.0/24", netip.Addr{}, "overlay.1")
	route(t, l.outside, "10.244.0.0/16", hostUpIP, "eth0")

	// Forwarding on in the host namespace only: /proc/sys/net belongs to the
	// namespace of the thread that opens it.
	rootBefore, err := os.ReadFile(ipForward)
	if err != nil {
		t.Fatal(err)
	}
	err = lab.Do(l.host, func() error {
		if err := os.WriteFile(ipForward, []byte("1"), 0o644); err != nil {
			return err
		}
		got, err := os.ReadFile(ipForward)
		if err == nil && strings.TrimSpace(string(got)) != "1" {
			err = errors.New("ip_forward reads " + string(got))
		}
		return err
	})
	if err != nil {
		t.Fatalf("enable forwarding in the host namespace: %v", err)
	}
	if rootAfter, err := os.ReadFile(ipForward); err != nil || string(rootAfter) != string(rootBefore) {
		t.Fatalf("the root namespace's ip_forward changed: %q -> %q (%v)", rootBefore, rootAfter, err)
	}
	return l
}

func TestTraffic(t *testing.T) {
	l := newTrafficLab(t)
	m, err := New(clusterNet, WithNetNS(l.host), WithOverlayDevice("overlay.1"), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	type flow struct {
		name     string
		from, to netns.NsHandle
		dst      netip.Addr
		wantSrc  netip.Addr
	}
	check := func(t *testing.T, flows []flow) {
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

	t.Run("without our table nothing is NATed", func(t *testing.T) {
		check(t, []flow{{"pod to outside", l.pod1, l.outside, outsideIP, pod1IP}})
	})

	mustEnsure(t, m, true)
	t.Run("with our table", func(t *testing.T) {
		check(t, []flow{
			{"pod to outside is masqueraded", l.pod1, l.outside, outsideIP, hostUpIP},
			{"pod to local pod keeps its source", l.pod1, l.pod2, pod2IP, pod1IP},
			{"pod to remote pod keeps its source", l.pod1, l.pod3, pod3IP, pod1IP},
			{"outside to local pod keeps its source", l.outside, l.pod1, pod1IP, outsideIP},
			{"outside to remote pod is masqueraded to the VTEP address", l.outside, l.pod3, pod3IP, vtepIP},
			// The host's own connections pick a source inside the network
			// (the bridge's or the VTEP's address): no NAT needed.
			{"host to local pod", l.host, l.pod1, pod1IP, netip.MustParseAddr("10.244.1.1")},
			{"host to remote pod", l.host, l.pod3, pod3IP, vtepIP},
		})
	})

	t.Run("without the overlay device rule outside to remote pod breaks", func(t *testing.T) {
		// The remote pod's replies to the outside client have no way back
		// through this host: the connection never completes.
		noDev, err := New(clusterNet, WithNetNS(l.host))
		if err != nil {
			t.Fatal(err)
		}
		defer noDev.Close()
		mustEnsure(t, noDev, true)
		_, err = observedSource(l.outside, l.pod3, pod3IP, 750*time.Millisecond)
		var nerr net.Error
		if !errors.As(err, &nerr) || !nerr.Timeout() {
			t.Errorf("outside to remote pod without the device rule: %v, want a timeout", err)
		}
		mustEnsure(t, m, true)
		check(t, []flow{{"and with it, it works", l.outside, l.pod3, pod3IP, vtepIP}})
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
		_, err = observedSource(l.pod1, l.outside, outsideIP, 750*time.Millisecond)
		var nerr net.Error
		if !errors.As(err, &nerr) || !nerr.Timeout() {
			t.Errorf("pod to outside through a forward drop: %v, want a timeout", err)
		}
		c := nftConn(t, l.host)
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "foreign"})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if changed, err := m.Ensure(); err != nil || changed {
			t.Fatalf("Ensure = %v, %v: another table's chains are none of our business", changed, err)
		}
		check(t, []flow{{"pod to outside again", l.pod1, l.outside, outsideIP, hostUpIP}})
	})

	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	t.Run("after Remove nothing is NATed", func(t *testing.T) {
		check(t, []flow{{"pod to outside", l.pod1, l.outside, outsideIP, pod1IP}})
	})
}
