package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// In a dual-stack network pods on different hosts reach each other over
// both families without NAT, and the outside with it; hosts join and
// leave, a restart drops no packet of either family, and a deleted IPv6
// route is repaired.
func TestDualStack(t *testing.T) {
	t.Parallel()
	testIPv6Network(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`, true)
}

// An IPv6-only network (overlay's own key space, subnets6/) does the same
// over IPv6 alone: pods have no IPv4 address, hosts no IPv4 device.
func TestIPv6Only(t *testing.T) {
	t.Parallel()
	testIPv6Network(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":6}}`, false)
}

// testIPv6Network runs the IPv6 scenario in a lab with network config
// config; dual says the network carries IPv4 too.
func testIPv6Network(t *testing.T, config string, dual bool) {
	l := labtest.New(t, lab.Config{NetworkConfig: config})
	nodes := labtest.Hosts(t, l, 2)
	if dual {
		waitRoutes(t, nodes, settle)
	}
	waitRoutes6(t, nodes, settle)
	pods := labtest.Pods(t, nodes, 1)
	for _, p := range pods {
		v6 := lease6(t, p.Node)
		if !v6.Contains(p.IPv6) || p.IP.IsValid() != dual {
			t.Fatalf("pod %s has addresses %v and %v, want one of its host's IPv6 lease %s (and an IPv4 one: %v)", p, p.IP, p.IPv6, v6, dual)
		}
	}
	err := mesh6Errors(pods)
	if dual {
		err = errors.Join(meshErrors(t, nodes, pods), err)
	}
	if err != nil {
		t.Fatalf("2 hosts x 1 pod:\n%v", err)
	}
	vni := "1"
	if !dual {
		vni = "6"
		for _, n := range nodes {
			if rs, err := n.Routes(); err != nil || len(rs) != 0 {
				t.Errorf("%s has IPv4 overlay routes in an IPv6-only network: %v %v", n.Name, rs, err)
			}
		}
		// The leases live in overlay's own key space, where no flanneld looks.
		cli, err := l.Etcd.Client()
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		for dir, want := range map[string]int{"subnets/": 0, "subnets6/": 2} {
			resp, err := cli.Get(ctxT(t, 10*time.Second), etcdv3.DefaultPrefix+"/"+dir, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || resp.Count != int64(want) {
				t.Errorf("keys under %s: %v (err %v), want %d", dir, resp, err, want)
			}
		}
	}
	for _, n := range nodes {
		r, ok, err := n.RouteTo(lease6(t, other(nodes, n)))
		if err != nil || !ok || r.Dev != "overlay-v6."+vni || !r.Onlink || r.Via != lease6(t, other(nodes, n)).Addr() {
			t.Errorf("%s's IPv6 route to its peer: %v (found %v, err %v), want via the peer subnet's address dev overlay-v6.%s onlink", n.Name, r, ok, err, vni)
		}
	}

	t.Run("masquerade to the outside", func(t *testing.T) {
		out, err := l.Underlay.AddOutside()
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		for _, p := range pods {
			for _, dst := range []netip.Addr{out.IP, out.IPv6} {
				want := p.Node.IP
				if dst.Is6() {
					want = p.Node.IPv6
				} else if !dual {
					continue
				}
				labtest.Eventually(t, settle, fmt.Sprintf("%s to reach the outside %s", p, dst), func() error {
					seen, err := lab.WhoAmI(p.NS, netip.AddrPortFrom(dst, lab.ProbePort), probeTimeout)
					if err != nil {
						return err
					}
					if seen != want {
						return fmt.Errorf("%s -> %s: the outside saw source %s, want the host's %s (masqueraded)", p, dst, seen, want)
					}
					return nil
				})
			}
		}
	})

	t.Run("a deleted IPv6 route is repaired", func(t *testing.T) {
		h1, peer := nodes[0], lease6(t, nodes[1])
		if err := h1.DeleteRoute(peer); err != nil {
			t.Fatal(err)
		}
		labtest.Eventually(t, settle, "h1's IPv6 route to h2 to come back", func() error {
			if _, ok, err := h1.RouteTo(peer); err != nil || !ok {
				return fmt.Errorf("no route to %s (err %v)", peer, err)
			}
			return nil
		})
		if err := errors.Join(reach6(pods[0], pods[1]), reach6(pods[1], pods[0])); err != nil {
			t.Error(err)
		}
	})

	t.Run("restart drops no packet of either family", func(t *testing.T) {
		a, b, h := pods[0], pods[1], nodes[1]
		before := subnetsOf(t, h)
		dsts := []netip.Addr{b.IPv6}
		if dual {
			dsts = append(dsts, b.IP)
		}
		var streams []*lab.Stream
		for _, dst := range dsts {
			s, err := lab.StartStream(a.NS, netip.AddrPortFrom(dst, lab.ProbePort), streamInterval, streamTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			warmUp(t, s, 5)
			streams = append(streams, s)
		}
		if err := h.Restart(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		labtest.WaitReady(t, h)
		seenAt := streams[0].Stats().Sent
		labtest.Eventually(t, 50*streamInterval+settle, "2.5 s of traffic after the restart", func() error {
			if sent := streams[0].Stats().Sent; sent < seenAt+50 {
				return fmt.Errorf("%d probes since ready", sent-seenAt)
			}
			return nil
		})
		for i, s := range streams {
			checkStream(t, fmt.Sprintf("%s -> %s across a SIGKILL restart of overlayd on %s", a, dsts[i], h.Name), s.Stop())
		}
		if after := subnetsOf(t, h); after != before {
			t.Errorf("%s's subnets changed across the restart: %s -> %s", h.Name, before, after)
		}
	})

	t.Run("a host joins and leaves", func(t *testing.T) {
		h3 := labtest.StartHost(t, l, "h3", 3)
		labtest.WaitReady(t, h3)
		p3 := labtest.AddPod(t, h3, "p1")
		all := append(slices.Clone(nodes), h3)
		waitRoutes6(t, all, settle)
		labtest.Eventually(t, settle, "every pod to reach h3's pod over IPv6 and back", func() error {
			var errs []error
			for _, p := range pods {
				errs = append(errs, reach6(p, p3), reach6(p3, p))
			}
			return errors.Join(errs...)
		})

		gone := lease6(t, h3)
		if err := p3.Delete(ctxT(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := h3.Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if out, err := h3.Teardown(ctxT(t, 30*time.Second)); err != nil {
			t.Fatalf("teardown h3: %v\n%s", err, out)
		}
		labtest.Eventually(t, settle, "h3's IPv6 routes to vanish everywhere", func() error {
			var errs []error
			for _, n := range nodes {
				if _, ok, err := n.RouteTo(gone); err != nil || ok {
					errs = append(errs, fmt.Errorf("%s still routes to %s (err %v)", n.Name, gone, err))
				}
			}
			return errors.Join(errs...)
		})
		if rs, err := h3.IPv6Routes(); err != nil || len(rs) != 0 {
			t.Errorf("h3 still has IPv6 overlay routes after teardown: %v %v", rs, err)
		}
		if err := mesh6Errors(pods); err != nil {
			t.Errorf("after h3 left:\n%v", err)
		}
	})
}

func lease6(t *testing.T, n *lab.Node) netip.Prefix {
	t.Helper()
	p, err := n.IPv6Lease()
	if err != nil || !p.IsValid() {
		t.Fatalf("%s's IPv6 lease: %v %v", n.Name, p, err)
	}
	return p
}

func subnetsOf(t *testing.T, n *lab.Node) subnet.Subnets {
	t.Helper()
	env, err := n.Env()
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return subnet.Subnets{IPv4: env.Lease(), IPv6: env.IPv6Lease()}
}

// other is the node of a pair that is not n.
func other(pair []*lab.Node, n *lab.Node) *lab.Node {
	if pair[0] == n {
		return pair[1]
	}
	return pair[0]
}

// reach6 is reach over IPv6: TCP with the source checked, and a ping.
func reach6(from, to *lab.Pod) error {
	seen, err := lab.WhoAmI(from.NS, netip.AddrPortFrom(to.IPv6, lab.ProbePort), probeTimeout)
	if err != nil {
		return fmt.Errorf("%s -> %s: %w", from, to.IPv6, err)
	}
	if seen != from.IPv6 {
		return fmt.Errorf("%s -> %s: the destination saw source %s, want %s (NAT between pods)", from, to.IPv6, seen, from.IPv6)
	}
	if _, err := lab.Ping(from.NS, to.IPv6, probeTimeout); err != nil {
		return fmt.Errorf("%s -> %s: %w", from, to.IPv6, err)
	}
	return nil
}

// mesh6Errors checks every pod reaches every other pod over IPv6.
func mesh6Errors(pods []*lab.Pod) error {
	var errs []error
	for _, from := range pods {
		for _, to := range pods {
			if from != to {
				errs = append(errs, reach6(from, to))
			}
		}
	}
	return errors.Join(errs...)
}
