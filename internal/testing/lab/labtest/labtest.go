// Package labtest builds internal/lab labs for tests: it checks the
// prerequisites (root, the binaries `make build plugins` builds), gives each
// lab of the process its own namespace tag, prints the tail of every
// overlayd log when the test fails, and removes everything when it ends —
// also after a failure — checking that no namespace of the lab is left.
package labtest

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var seq atomic.Int64

// New builds a lab for t (cfg.Root and cfg.Tag are filled in), or stops t
// if it cannot run here (skip, or fail under CI=true).
func New(t testing.TB, cfg lab.Config) *lab.Lab {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.Binary(t, "overlayd")
	testenv.Binary(t, "overlay-cni")
	testenv.PluginDir(t)
	if cfg.Root == "" {
		cfg.Root = testenv.RepoRoot(t)
	}
	if cfg.Tag == "" {
		cfg.Tag = "t" + strconv.FormatInt(seq.Add(1), 10)
	}
	// OVERLAY_LAB_KEEP=1 keeps the work directory (logs, etcd data) for a
	// look after the test.
	if os.Getenv("OVERLAY_LAB_KEEP") != "" {
		cfg.KeepDir = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
	defer cancel()
	l, err := lab.New(ctx, cfg)
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lab %s: log tails:\n%s", l.Run(), l.LogTails(40))
		}
		if cfg.KeepDir {
			t.Logf("lab %s: work directory kept: %s", l.Run(), l.Dir)
		}
		if err := l.Close(); err != nil {
			t.Errorf("lab cleanup: %v", err)
		}
	})
	return l
}

// Hosts adds hosts h1..hN (198.18.0.1..N) to l, starts overlayd on each and
// waits until all are ready.
func Hosts(t testing.TB, l *lab.Lab, n int) []*lab.Node {
	t.Helper()
	nodes := make([]*lab.Node, 0, n)
	for i := 1; i <= n; i++ {
		nodes = append(nodes, StartHost(t, l, "h"+strconv.Itoa(i), i))
	}
	for _, node := range nodes {
		WaitReady(t, node)
	}
	return nodes
}

// StartHost adds host name with underlay address 198.18.0.<n> and starts
// overlayd on it (without waiting for readiness).
func StartHost(t testing.TB, l *lab.Lab, name string, n int) *lab.Node {
	t.Helper()
	node, err := l.AddNode(name, n)
	if err != nil {
		t.Fatalf("add host %s: %v", name, err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	return node
}

// WaitReady waits for node's /readyz. Start-up waits for no timer (the
// lease, the device, the first reconcile), but a cold, busy machine may take
// seconds to schedule a fresh process and fsync its first etcd writes.
func WaitReady(t testing.TB, node *lab.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(30*time.Second))
	defer cancel()
	if err := node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

// Pods adds pods p1..pN on every node.
func Pods(t testing.TB, nodes []*lab.Node, n int) []*lab.Pod {
	t.Helper()
	var pods []*lab.Pod
	for _, node := range nodes {
		for i := 1; i <= n; i++ {
			pods = append(pods, AddPod(t, node, "p"+strconv.Itoa(i)))
		}
	}
	return pods
}

// AddPod adds one pod to node.
func AddPod(t testing.TB, node *lab.Node, name string) *lab.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(30*time.Second))
	defer cancel()
	p, err := node.AddPod(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Eventually is testenv.Eventually, here because every lab test uses it.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return testenv.Eventually(t, timeout, what, cond)
}
