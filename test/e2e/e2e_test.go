package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// Three hosts with two pods each: every pod reaches every pod, on its own
// host and across hosts, and every host every pod, without NAT. A fourth
// host joins and is reachable everywhere; torn down, its routes vanish
// everywhere. Neither waits for a timer: both follow the lease watch.
func TestPodsReachEachOtherAndHostsJoinAndLeave(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 3)
	waitRoutes(t, nodes, settle)
	pods := labtest.Pods(t, nodes, 2)
	if err := meshErrors(t, nodes, pods); err != nil {
		t.Fatalf("3 hosts x 2 pods:\n%v", err)
	}

	// A fourth host joins.
	h4 := labtest.StartHost(t, l, "h4", 4)
	labtest.WaitReady(t, h4)
	joined := time.Now()
	h4pods := []*lab.Pod{labtest.AddPod(t, h4, "p1"), labtest.AddPod(t, h4, "p2")}
	all := append(slices.Clone(nodes), h4)
	took := labtest.Eventually(t, settle, "every host and pod to reach h4's pods", func() error {
		var errs []error
		for _, to := range h4pods {
			for _, from := range pods {
				errs = append(errs, reach(from, to))
			}
			for _, n := range nodes {
				errs = append(errs, hostReach(n, lease(t, n), to))
			}
		}
		return errors.Join(errs...)
	})
	t.Logf("h4's pods reachable from everywhere %s after h4 was ready (the last probe round took %s)", time.Since(joined).Round(time.Millisecond), took.Round(time.Millisecond))
	waitRoutes(t, all, settle)
	if err := meshErrors(t, all, append(slices.Clone(pods), h4pods...)); err != nil {
		t.Fatalf("4 hosts:\n%v", err)
	}

	// h4 leaves: stop, then `overlayd teardown`.
	gone := lease(t, h4)
	if err := h4.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out, err := h4.Teardown(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatalf("teardown h4: %v", err)
	}
	t.Logf("overlayd teardown on h4:\n%s", out)
	took = labtest.Eventually(t, settle, "h4's routes to vanish everywhere", func() error {
		var errs []error
		for _, n := range nodes {
			if _, ok, err := n.RouteTo(gone); err != nil || ok {
				errs = append(errs, fmt.Errorf("%s still routes to %s (err %v)", n.Name, gone, err))
			}
		}
		return errors.Join(errs...)
	})
	t.Logf("h4's routes gone everywhere %s after its teardown", took)
	if h, err := h4.Routes(); err != nil || len(h) != 0 {
		t.Errorf("h4 still has overlay routes after teardown: %v %v", h, err)
	}
	ll, err := l.Leases(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := ll.ByNode("h4"); ok {
		t.Errorf("h4's lease is still listed after teardown: %+v", r)
	}
	waitRoutes(t, nodes, settle)
	if err := meshErrors(t, nodes, pods); err != nil {
		t.Fatalf("after h4 left:\n%v", err)
	}
}

// Restarting overlayd — gracefully or killed — drops no packet between pods
// on two hosts, and the host keeps its subnet.
func TestRestartDropsNoPackets(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 2)
	waitRoutes(t, nodes, settle)
	a, b := labtest.AddPod(t, nodes[0], "p1"), labtest.AddPod(t, nodes[1], "p1")
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		host *lab.Node
	}{
		{"SIGTERM", syscall.SIGTERM, nodes[1]},
		{"SIGKILL", syscall.SIGKILL, nodes[1]},
		{"SIGKILL", syscall.SIGKILL, nodes[0]},
	} {
		t.Run(tc.name+" "+tc.host.Name, func(t *testing.T) {
			h := tc.host
			before := lease(t, h)
			oldPID := h.PID()
			s, err := lab.StartStream(a.NS, netip.AddrPortFrom(b.IP, lab.ProbePort), streamInterval, streamTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			warmUp(t, s, 5)
			if err := h.Restart(tc.sig); err != nil {
				t.Fatal(err)
			}
			labtest.WaitReady(t, h)
			if h.PID() == oldPID {
				t.Fatalf("overlayd on %s was not restarted", h.Name)
			}
			// Keep probing across a few periodic kernel resyncs (1 s) of
			// the new daemon: a flush or a rewrite would show here.
			seenAt := s.Stats().Sent
			labtest.Eventually(t, 50*streamInterval+settle, "2.5 s of traffic after the restart", func() error {
				if sent := s.Stats().Sent; sent < seenAt+50 {
					return fmt.Errorf("%d probes since ready", sent-seenAt)
				}
				return nil
			})
			checkStream(t, fmt.Sprintf("%s -> %s across a %s restart of overlayd on %s", a, b, tc.name, h.Name), s.Stop())
			if after := lease(t, h); after != before {
				t.Errorf("%s's subnet changed across the restart: %s -> %s", h.Name, before, after)
			}
			ll, err := l.Leases(ctxT(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if r, ok := ll.ByNode(h.Name); !ok || r.Subnet != before.String() {
				t.Errorf("lease list after the restart: %s holds %+v, want %s", h.Name, r, before)
			}
			if err := errors.Join(reach(a, b), reach(b, a)); err != nil {
				t.Error(err)
			}
		})
	}
}

// With etcd down for 30 s pod traffic keeps flowing; a host started during
// the outage gets its lease when etcd is back and becomes reachable.
func TestEtcdOutage(t *testing.T) {
	t.Parallel()
	const outage = 30 * time.Second
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 2)
	waitRoutes(t, nodes, settle)
	a, b := labtest.AddPod(t, nodes[0], "p1"), labtest.AddPod(t, nodes[1], "p1")
	s, err := lab.StartStream(a.NS, netip.AddrPortFrom(b.IP, lab.ProbePort), streamInterval, streamTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	warmUp(t, s, 5)

	l.Etcd.Stop()
	down := time.Now()
	t.Logf("etcd stopped")
	h3 := labtest.StartHost(t, l, "h3", 3) // waits for etcd
	// Watch the data path through the outage: the stream, and a fresh TCP
	// connection each way every second.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ; time.Since(down) < outage; <-tick.C {
		if st := s.Stats(); len(st.Lost) > 0 {
			t.Fatalf("probes lost during the etcd outage (%s in): %s", time.Since(down).Round(time.Second), st)
		}
		if err := errors.Join(reach(a, b), reach(b, a)); err != nil {
			t.Fatalf("during the etcd outage (%s in): %v", time.Since(down).Round(time.Second), err)
		}
		if _, err := h3.Lease(); err == nil {
			t.Fatalf("h3 wrote subnet.env while etcd was down")
		}
	}
	if err := l.Etcd.Start(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	t.Logf("etcd started again after %s", up.Sub(down).Round(time.Millisecond))
	ctx := ctxT(t, 60*time.Second)
	if err := h3.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("h3 ready %s after etcd came back", time.Since(up).Round(time.Millisecond))
	c := labtest.AddPod(t, h3, "p1")
	// Nothing to wait for but h3's routes reaching the others and back.
	took := labtest.Eventually(t, settle, "h3's pod to be reachable from the others and reach them", func() error {
		return errors.Join(reach(a, c), reach(b, c), reach(c, a), reach(c, b))
	})
	t.Logf("h3's pod reachable both ways %s after it was added (%s after etcd came back)", took, time.Since(up).Round(time.Millisecond))
	checkStream(t, fmt.Sprintf("%s -> %s across the etcd outage", a, b), s.Stop())
	all := append(slices.Clone(nodes), h3)
	waitRoutes(t, all, settle)
	if err := meshErrors(t, all, []*lab.Pod{a, b, c}); err != nil {
		t.Fatal(err)
	}
}

// `overlayd lease list` shows every host; a forced revoke of a live host's
// lease makes that host claim the same subnet again within seconds.
func TestLeaseListAndForcedRevoke(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 3)
	ctx := ctxT(t, time.Minute)
	ll, err := l.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ll.Leases) != 3 || len(ll.Invalid) != 0 {
		t.Errorf("lease list: %d leases, %d invalid; want 3 and 0: %+v", len(ll.Leases), len(ll.Invalid), ll)
	}
	for _, n := range nodes {
		r, ok := ll.ByNode(n.Name)
		switch {
		case !ok:
			t.Errorf("lease list has no lease of %s: %+v", n.Name, ll.Leases)
		case r.Subnet != lease(t, n).String() || r.PublicIP != n.IP.String() || r.Alive != "yes" || r.Reserved || r.VtepMAC == "":
			t.Errorf("lease of %s = %+v, want subnet %s (its subnet.env), public IP %s, alive, not reserved, a VTEP MAC", n.Name, r, lease(t, n), n.IP)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	waitRoutes(t, nodes, settle)
	victim := nodes[1]
	sub := lease(t, victim)
	old, _ := ll.ByNode(victim.Name)

	// Without --force a live owner's lease is refused and kept.
	if out, err := l.CLI(ctx, "lease", "revoke", sub.String()); err == nil {
		t.Fatalf("revoke of a live host's lease without --force succeeded: %s", out)
	}
	if ll2, err := l.Leases(ctx); err != nil {
		t.Fatal(err)
	} else if r, _ := ll2.ByNode(victim.Name); r.ModRevision != old.ModRevision {
		t.Fatalf("a refused revoke changed the lease: %+v -> %+v", old, r)
	}

	out, err := l.CLI(ctx, "lease", "revoke", sub.String(), "--force")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("overlayd lease revoke %s --force: %s", sub, out)
	// The victim's watch of its own key sees the deletion and re-claims
	// at once, or after one retry interval (1 s) if its hold had just
	// started.
	took := labtest.Eventually(t, time.Second+settle, victim.Name+" to claim "+sub.String()+" again", func() error {
		ll, err := l.Leases(ctx)
		if err != nil {
			return err
		}
		r, ok := ll.ByNode(victim.Name)
		if !ok || r.ModRevision <= old.ModRevision {
			return fmt.Errorf("%s's lease: %+v (listed: %v)", victim.Name, r, ok)
		}
		if r.Subnet != sub.String() || r.Alive != "yes" {
			return fmt.Errorf("%s re-claimed %+v, want %s", victim.Name, r, sub)
		}
		return nil
	})
	t.Logf("%s re-claimed %s %s after the revoke", victim.Name, sub, took)
	if got := lease(t, victim); got != sub {
		t.Errorf("%s's subnet.env says %s, want %s", victim.Name, got, sub)
	}
	if done, how := victim.Exited(); isClosed(done) {
		t.Fatalf("overlayd on %s exited after the revoke: %v", victim.Name, how())
	}
	labtest.WaitReady(t, victim)
	waitRoutes(t, nodes, settle)
	pods := labtest.Pods(t, nodes, 1)
	if err := meshErrors(t, nodes, pods); err != nil {
		t.Fatal(err)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A route deleted by hand is put back by the reconciler promptly (it hears
// the kernel's notification) and traffic flows again.
func TestHandDeletedRouteIsRepaired(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 2)
	waitRoutes(t, nodes, settle)
	a, b := labtest.AddPod(t, nodes[0], "p1"), labtest.AddPod(t, nodes[1], "p1")
	dst := lease(t, nodes[1])
	// Route notifications of h1 show the deletion and the repair, however
	// quick the repair is.
	updates := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeAt(nodes[0].NS, updates, done); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		before, ok, err := nodes[0].RouteTo(dst)
		if err != nil || !ok {
			t.Fatalf("h1 has no route to %s: %v", dst, err)
		}
		deleted := time.Now()
		if err := nodes[0].DeleteRoute(dst); err != nil {
			t.Fatal(err)
		}
		waitRouteEvent(t, updates, unix.RTM_DELROUTE, dst, settle)
		waitRouteEvent(t, updates, unix.RTM_NEWROUTE, dst, settle)
		took := time.Since(deleted)
		if r, ok, err := nodes[0].RouteTo(dst); err != nil || r != before {
			t.Fatalf("h1's route to %s after the repair: %s (present %v, err %v), want %s", dst, r, ok, err, before)
		}
		t.Logf("deletion %d: %q repaired in %s", i+1, before, took.Round(time.Microsecond))
	}
	if err := errors.Join(reach(a, b), reach(b, a)); err != nil {
		t.Fatal(err)
	}
}

// waitRouteEvent waits for a route notification of type typ for dst.
func waitRouteEvent(t *testing.T, updates <-chan netlink.RouteUpdate, typ uint16, dst netip.Prefix, timeout time.Duration) {
	t.Helper()
	timeout = testenv.Deadline(timeout)
	deadline := time.After(timeout)
	for {
		select {
		case u := <-updates:
			if u.Type == typ && u.Dst != nil && u.Dst.String() == dst.String() {
				return
			}
		case <-deadline:
			t.Fatalf("no route notification %d for %s within %s", typ, dst, timeout)
		}
	}
}
