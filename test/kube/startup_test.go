package kubee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// podsPerNodeEnv, set to a number, runs TestPodStartup (not part of make
// kube-e2e): that many pods per node are created in one kubectl create.
const podsPerNodeEnv = "KUBE_PODS_PER_NODE"

// TestPodStartup measures, on the lab with overlay deployed, how long a
// pod takes from its creation through the API to Running with its address
// (assigned by overlay-cni): N pods per node created in one kubectl
// create, each timed by a watch from the first event that shows it (its
// creation) to the first that shows it Running with a pod IP.
// Documentation/benchmarks.md holds the figures.
func TestPodStartup(t *testing.T) {
	v := os.Getenv(podsPerNodeEnv)
	if v == "" {
		t.Skipf("set %s=50 to measure pod start-up (Documentation/benchmarks.md)", podsPerNodeEnv)
	}
	perNode, err := strconv.Atoi(v)
	if err != nil || perNode < 1 || perNode > 110 {
		t.Fatalf("%s=%q: want a number of pods per node, 1..110 (kubelet's maxPods)", podsPerNodeEnv, v)
	}
	c := deploy(t, passes[0])
	var docs []string
	var names []string
	for _, n := range c.nodes {
		for i := range perNode {
			name := fmt.Sprintf("s-%s-%d", n.Name, i)
			names = append(names, name)
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {bench: startup}}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 0
  containers:
  - {name: c, image: %s, imagePullPolicy: Never, args: [pause]}
`, name, n.Name, echoImage))
		}
	}
	// The watch: kubectl prints every change of the pods as a JSON object.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := exec.CommandContext(ctx, filepath.Join(c.kubeBin, "kubectl"), "--kubeconfig="+c.kubeconfig("admin"),
		"get", "pods", "-l", "bench=startup", "--watch", "-o", "json")
	watch.Env = testenv.ProgramEnv()
	watch.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Do(c.cp.NS, watch.Start); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = watch.Wait() }()
	type seen struct {
		name    string
		at      time.Time
		running bool
	}
	events := make(chan seen, 1024)
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var p podJSON
			if err := dec.Decode(&p); err != nil {
				if err != io.EOF {
					close(events)
				}
				return
			}
			events <- seen{p.Metadata.Name, time.Now(), p.Status.Phase == "Running" && p.Status.PodIP != ""}
		}
	}()
	// The watch is established once it shows a sentinel pod (one that no
	// node can run): from then on it sees every pod from its creation.
	sentinel := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: s-sentinel, labels: {bench: startup}}
spec:
  nodeSelector: {kubernetes.io/hostname: no-such-node}
  containers:
  - {name: c, image: %s, imagePullPolicy: Never, args: [pause]}
`, echoImage)
	if out, err := c.kubectl(context.Background(), []byte(sentinel), "create", "-f", "-"); err != nil {
		t.Fatalf("create the sentinel pod: %v\n%s", err, out)
	}
	for established := false; !established; {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("the watch ended before it showed the sentinel pod")
			}
			established = e.name == "s-sentinel"
		case <-time.After(testenv.Deadline(time.Minute)):
			t.Fatal("the watch did not show the sentinel pod within a minute")
		}
	}
	start := time.Now()
	if out, err := c.kubectl(context.Background(), []byte(strings.Join(docs, "---\n")), "create", "-f", "-"); err != nil {
		t.Fatalf("create %d pods: %v\n%s", len(names), err, out)
	}
	applied := time.Since(start)
	created := map[string]time.Time{}
	running := map[string]time.Duration{}
	deadline := time.After(testenv.Deadline(10 * time.Minute))
	for len(running) < len(names) {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("the watch ended with %d of %d pods Running", len(running), len(names))
			}
			if e.name == "s-sentinel" {
				continue
			}
			if _, ok := created[e.name]; !ok {
				created[e.name] = e.at
			}
			if _, done := running[e.name]; e.running && !done {
				running[e.name] = e.at.Sub(created[e.name])
			}
		case <-deadline:
			t.Fatalf("%d of %d pods Running with an address after %s", len(running), len(names), testenv.Deadline(10*time.Minute))
		}
	}
	var all []time.Duration
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d pods per node created by one kubectl create (which took %s); each pod from its creation to Running with its address:\n", perNode, applied.Round(time.Millisecond))
	for _, n := range c.nodes {
		var d []time.Duration
		for name, v := range running {
			if strings.HasPrefix(name, "s-"+n.Name+"-") {
				d = append(d, v)
			}
		}
		all = append(all, d...)
		fmt.Fprintf(&b, "  %s: %s\n", n.Name, quantiles(d))
	}
	fmt.Fprintf(&b, "  all: %s\n", quantiles(all))
	t.Log(b.String())
}

// quantiles is "p50 X, p99 Y, max Z" of d.
func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", q(0.50).Round(10*time.Millisecond), q(0.99).Round(10*time.Millisecond), d[len(d)-1].Round(10*time.Millisecond), len(d))
}
