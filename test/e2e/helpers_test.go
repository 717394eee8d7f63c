package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deadlines (each scaled by testenv.Deadline). A deadline bounds "this never
// happens"; none of them measures speed.
var (
	// probeTimeout bounds one TCP probe or ping. A probe between namespaces
	// answers in microseconds; the bound only has to outlast a SYN
	// retransmission (1 s) and a busy scheduler.
	probeTimeout = testenv.Deadline(5 * time.Second)
	// settle bounds a change that waits for no timer: a lease event
	// reaching every host's kernel, a route repaired on the kernel's
	// notification. Only scheduling stands between cause and effect.
	settle = testenv.Slack
)

// Continuous traffic: 20 UDP probes a second. UDP has no retransmission, so
// a dropped packet is a probe never answered; one not answered within
// streamTimeout never will be (nothing in the path holds a packet that
// long), and counts as lost.
var (
	streamInterval = 50 * time.Millisecond
	streamTimeout  = testenv.Deadline(5 * time.Second)
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(d))
	t.Cleanup(cancel)
	return ctx
}

func lease(t *testing.T, n *lab.Node) netip.Prefix {
	t.Helper()
	p, err := n.Lease()
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return p
}

// reach connects from a pod to a pod's responder and checks the source
// address the destination saw is the source pod's: no NAT between pods.
func reach(from, to *lab.Pod) error {
	seen, err := lab.WhoAmI(from.NS, netip.AddrPortFrom(to.IP, lab.ProbePort), probeTimeout)
	if err != nil {
		return fmt.Errorf("%s -> %s: %w", from, to, err)
	}
	if seen != from.IP {
		return fmt.Errorf("%s -> %s: the destination saw source %s, want %s (NAT between pods)", from, to, seen, from.IP)
	}
	return nil
}

// hostReach connects from a host to a pod's responder, checks the source
// is one of the host's own overlay addresses (its lease), and pings the pod.
func hostReach(from *lab.Node, own netip.Prefix, to *lab.Pod) error {
	seen, err := lab.WhoAmI(from.NS, netip.AddrPortFrom(to.IP, lab.ProbePort), probeTimeout)
	if err != nil {
		return fmt.Errorf("host %s -> %s: %w", from.Name, to, err)
	}
	if !own.Contains(seen) {
		return fmt.Errorf("host %s -> %s: the pod saw source %s, want an address of %s's lease %s", from.Name, to, seen, from.Name, own)
	}
	if _, err := lab.Ping(from.NS, to.IP, probeTimeout); err != nil {
		return fmt.Errorf("host %s -> %s: %w", from.Name, to, err)
	}
	return nil
}

// meshErrors checks every pod reaches every other pod and every host every
// pod, and returns every failure.
func meshErrors(t *testing.T, nodes []*lab.Node, pods []*lab.Pod) error {
	t.Helper()
	var errs []error
	for _, from := range pods {
		for _, to := range pods {
			if from != to {
				errs = append(errs, reach(from, to))
			}
		}
	}
	for _, n := range nodes {
		own := lease(t, n)
		for _, to := range pods {
			errs = append(errs, hostReach(n, own, to))
		}
	}
	return errors.Join(errs...)
}

// routedSubnets returns the subnets n has overlay routes to, of the
// family list lists (lab.Node.Routes or IPv6Routes).
func routedSubnets(n *lab.Node, list func(*lab.Node) ([]lab.Route, error)) ([]netip.Prefix, error) {
	rs, err := list(n)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Dst)
	}
	return out, nil
}

// waitRoutes waits until every node routes exactly to every other node's lease.
func waitRoutes(t *testing.T, nodes []*lab.Node, timeout time.Duration) time.Duration {
	t.Helper()
	return waitRoutesOf(t, nodes, timeout, "", lease, (*lab.Node).Routes)
}

// waitRoutes6 is waitRoutes over IPv6: every node routes exactly to every
// other node's IPv6 lease.
func waitRoutes6(t *testing.T, nodes []*lab.Node, timeout time.Duration) time.Duration {
	t.Helper()
	return waitRoutesOf(t, nodes, timeout, " IPv6", lease6, (*lab.Node).IPv6Routes)
}

// waitRoutesOf waits until every node's routes listed by list go exactly
// to every other node's leaseOf.
func waitRoutesOf(t *testing.T, nodes []*lab.Node, timeout time.Duration, fam string,
	leaseOf func(*testing.T, *lab.Node) netip.Prefix, list func(*lab.Node) ([]lab.Route, error)) time.Duration {
	t.Helper()
	leases := map[*lab.Node]netip.Prefix{}
	for _, n := range nodes {
		leases[n] = leaseOf(t, n)
	}
	return labtest.Eventually(t, timeout, "every host routes to every other host's"+fam+" lease", func() error {
		var errs []error
		for _, n := range nodes {
			var want []netip.Prefix
			for _, o := range nodes {
				if o != n {
					want = append(want, leases[o])
				}
			}
			slices.SortFunc(want, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
			got, err := routedSubnets(n, list)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				errs = append(errs, fmt.Errorf("%s routes to%s %v, want %v", n.Name, fam, got, want))
			}
		}
		return errors.Join(errs...)
	})
}

// checkStream fails t if s lost any probe.
func checkStream(t *testing.T, what string, st lab.StreamStats) {
	t.Helper()
	t.Logf("%s: %s", what, st)
	if st.Sent == 0 || len(st.Lost) > 0 || st.Received != st.Sent {
		t.Errorf("%s: %s; want every probe answered", what, st)
	}
}

// warmUp waits until s has had n probes answered.
func warmUp(t *testing.T, s *lab.Stream, n int) {
	t.Helper()
	labtest.Eventually(t, time.Duration(n)*streamInterval+settle, "probe stream to start", func() error {
		st := s.Stats()
		if len(st.Lost) > 0 {
			t.Fatalf("probe stream lost probes before anything happened: %s", st)
		}
		if st.Received < n {
			return fmt.Errorf("%s", st)
		}
		return nil
	})
}

// flannelLeaseHolder adds the lab's node h2 as flanneld leaves a host
// (flannelhost: 10.244.77.0/24 on flannel.1 with a fixed VTEP MAC) and
// writes its lease (returned: flannelhost's Build writes it again), first, so the overlayd hosts started after it lease
// around it; the caller builds its data path once their leases are known.
func flannelLeaseHolder(ctx context.Context, t *testing.T, l *lab.Lab, cli *clientv3.Client) (*lab.Node, flannelhost.Host, clientv3.LeaseID) {
	t.Helper()
	h2, err := l.AddNode("h2", 2)
	if err != nil {
		t.Fatal(err)
	}
	fl := flannelhost.Host{Iface: h2.Iface, PublicIP: h2.IP, Network: netip.MustParsePrefix("10.244.0.0/16"),
		Subnet: netip.MustParsePrefix("10.244.77.0/24"), VNI: 1, VtepMAC: net.HardwareAddr{0x5a, 0x8e, 0x11, 0x22, 0x33, 0x02},
		SubnetFile: filepath.Join(h2.Dir, "flannel", "subnet.env")}
	grant, err := cli.Grant(ctx, flannelhost.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, fl.LeaseKey(etcdv3.DefaultPrefix), fl.LeaseValue(), clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	return h2, fl, grant.ID
}
