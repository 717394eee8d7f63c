package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestNewPodsWorkAfterLeaseChange: a host whose lease changes (here: it was
// torn down and its old subnet reserved for someone else before it came
// back) starts new pods in its new lease with no manual step, and they
// reach pods on other hosts with their real addresses (regression: every
// ADD failed with `"cni0" already has an IP address different from …`
// because the bridge kept the old gateway). The pod left on the old
// subnet is still deleted cleanly.
func TestNewPodsWorkAfterLeaseChange(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	waitRoutes(t, nodes, testenv.Slack)
	oldPod := labtest.AddPod(t, h1, "old")
	peer := labtest.AddPod(t, h2, "peer")
	if err := reach(oldPod, peer); err != nil {
		t.Fatal(err)
	}
	oldLease := lease(t, h1)

	ctx := ctxT(t, testenv.Deadline(time.Minute))
	if err := h1.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if out, err := h1.Teardown(ctx); err != nil {
		t.Fatalf("teardown of %s: %v\n%s", h1.Name, err, out)
	}
	if out, err := l.CLI(ctx, "lease", "reserve", oldLease.String(), "--public-ip", "198.18.0.99"); err != nil {
		t.Fatalf("reserve %s: %v\n%s", oldLease, err, out)
	}
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h1)
	newLease := lease(t, h1)
	if newLease == oldLease {
		t.Fatalf("%s got its old lease %s back although it is reserved", h1.Name, oldLease)
	}
	waitRoutes(t, nodes, testenv.Slack)

	newPod := labtest.AddPod(t, h1, "new")
	if !newLease.Contains(newPod.IP) {
		t.Errorf("new pod %s is outside %s's new lease %s", newPod, h1.Name, newLease)
	}
	for _, pair := range [][2]*lab.Pod{{newPod, peer}, {peer, newPod}} {
		if err := reach(pair[0], pair[1]); err != nil {
			t.Error(err)
		}
	}
	if err := oldPod.Delete(ctx); err != nil {
		t.Errorf("delete the pod of the old lease: %v", err)
	}
	if err := reach(newPod, peer); err != nil {
		t.Errorf("after deleting the old pod: %v", err)
	}
}
