package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// fakeSubnet places fake peer i in the lab's default network
// (10.244.0.0/16), away from the low subnets; a test adds fewer than 150.
func fakeSubnet(i int) netip.Prefix {
	if i >= 150 {
		panic(fmt.Sprintf("fake peer %d: the network has no room", i))
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i), 0}), 24)
}

// faultLab is a lab of three hosts, each with a pod, probe streams between
// the pods, 30 fake peers, and readiness sampled throughout.
type faultLab struct {
	l      *lab.Lab
	f      *fleet
	nodes  []*lab.Node
	leases map[string]hostLease
	ss     *streams
	rd     *readiness
}

func startFaultLab(t *testing.T, l *lab.Lab, reg *etcdv3.Registry, rng *rand.Rand) *faultLab {
	t.Helper()
	f := newFleet(reg, rng, fakeSubnet)
	if err := f.add(ctxT(t, time.Minute), 30); err != nil {
		t.Fatal(err)
	}
	nodes := labtest.Hosts(t, l, 3)
	leases := hostLeases(t, f, nodes)
	for _, hl := range leases {
		f.avoid[hl.Subnet] = true
	}
	converged(t, f, nodes, 20*time.Second)
	var pods []*lab.Pod
	for _, n := range nodes {
		pods = append(pods, labtest.AddPod(t, n, "p1"))
	}
	fl := &faultLab{l: l, f: f, nodes: nodes, leases: leases, ss: startStreams(t, pods), rd: watchReadiness(nodes)}
	t.Cleanup(fl.rd.close)
	return fl
}

// churn changes up to n fake leases of each kind and says what it did.
func (fl *faultLab) churn(t *testing.T, n int) churned {
	t.Helper()
	c, err := fl.f.churn(ctxT(t, 2*time.Minute), n)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// healthy checks that no packet was lost, every overlayd runs, and every
// host still holds its lease with its etcd lease.
func (fl *faultLab) healthy(t *testing.T, when string) {
	t.Helper()
	fl.dataPath(t, when)
	if now := hostLeases(t, fl.f, fl.nodes); fmt.Sprint(now) != fmt.Sprint(fl.leases) {
		t.Fatalf("%s: host leases changed: %v -> %v", when, fl.leases, now)
	}
}

// dataPath checks that no packet was lost and every overlayd runs; it
// needs no etcd.
func (fl *faultLab) dataPath(t *testing.T, when string) {
	t.Helper()
	alive(t, fl.nodes)
	if err := fl.ss.lost(); err != nil {
		t.Fatalf("%s: probes lost: %v", when, err)
	}
}

// noReadinessLoss fails t if a host reported not ready since t0.
func (fl *faultLab) noReadinessLoss(t *testing.T, t0 time.Time, what string) {
	t.Helper()
	for _, c := range fl.rd.since(t0) {
		if !c.Ready {
			t.Errorf("%s: %s reported not ready %s in: %s", what, c.Node, c.At.Sub(t0).Round(time.Millisecond), c.Reason)
		}
	}
}

// waitNotReady waits until every host reports not ready with a reason
// containing why, and returns how long the slowest took.
func (fl *faultLab) waitNotReady(t *testing.T, t0 time.Time, timeout time.Duration, why string) time.Duration {
	t.Helper()
	var slowest time.Duration
	labtest.Eventually(t, timeout, "every host to report not ready ("+why+")", func() error {
		var errs []error
		for _, n := range fl.nodes {
			var at time.Time
			for _, c := range fl.rd.since(t0) {
				if c.Node == n.Name && !c.Ready && strings.Contains(c.Reason, why) {
					at = c.At
					break
				}
			}
			if at.IsZero() {
				errs = append(errs, fmt.Errorf("%s still ready", n.Name))
				continue
			}
			slowest = max(slowest, at.Sub(t0))
		}
		return errors.Join(errs...)
	})
	return slowest
}

func (fl *faultLab) waitReady(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	return labtest.Eventually(t, timeout, "every host to be ready again", func() error {
		for _, n := range fl.nodes {
			if !fl.rd.ready(n.Name) {
				return fmt.Errorf("%s not ready", n.Name)
			}
		}
		return nil
	})
}

// cliLeases runs `overlayd lease list` with the lab's endpoints and checks
// it lists every host's lease and every fake one.
func (fl *faultLab) cliLeases(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(30*time.Second))
	defer cancel()
	ll, err := fl.l.Leases(ctx)
	if err != nil {
		return err
	}
	if want := len(fl.f.leases) + len(fl.nodes); len(ll.Leases) != want {
		return fmt.Errorf("lease list shows %d leases, want %d", len(ll.Leases), want)
	}
	for _, n := range fl.nodes {
		if r, ok := ll.ByNode(n.Name); !ok || r.Subnet != fl.leases[n.Name].Subnet.String() {
			return fmt.Errorf("lease list: %s holds %+v, want %s", n.Name, r, fl.leases[n.Name].Subnet)
		}
	}
	return nil
}

// leaderIndex returns the index of the cluster member that leads.
func leaderIndex(t *testing.T, cli *clientv3.Client, eps []string) int {
	t.Helper()
	var idx int
	labtest.Eventually(t, 30*time.Second, "a leader", func() error {
		for i, ep := range eps {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(2*time.Second))
			st, err := cli.Status(ctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				idx = i
				return nil
			}
		}
		return errors.New("no member says it leads")
	})
	return idx
}

// A 3-member etcd cluster loses its leader, then a second member (quorum
// lost), then a member comes back and another goes: every overlayd and the
// CLI carry on with the members left; while a member is down, leases
// added, removed and changed reach every host's kernel exactly, and no host
// even reports not ready; quorum loss is reported by /readyz within the
// liveness TTL and survived like an outage, the data path untouched. No
// lease is lost and no probe between the pods dropped throughout.
func TestClusterMemberFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	sd := seed(t)
	rng := rand.New(rand.NewPCG(sd, sd^0x636c75))
	cluster := etcdtest.StartCluster(t, 3)
	eps := cluster.Endpoints()
	cli := newClient(t, eps...)
	cluster.WaitHealthy(t, cli)
	l := labtest.New(t, lab.Config{})
	l.Etcd.Stop() // the hosts use the cluster
	if err := l.UseEtcd(ctxT(t, 30*time.Second), eps...); err != nil {
		t.Fatal(err)
	}
	fl := startFaultLab(t, l, etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix), rng)
	running := []int{0, 1, 2}
	stop := func(i int) {
		cluster.Stop(i)
		running = slices.DeleteFunc(running, func(x int) bool { return x == i })
	}

	// 1. The leader stops.
	leader := leaderIndex(t, cli, eps)
	stop(leader)
	t0 := time.Now()
	c := fl.churn(t, 8)
	took := converged(t, fl.f, fl.nodes, 30*time.Second)
	if err := fl.cliLeases(t); err != nil {
		t.Fatalf("leader m%d stopped: the CLI did not fail over: %v", leader, err)
	}
	fl.healthy(t, "leader stopped")
	fl.noReadinessLoss(t, t0, fmt.Sprintf("leader m%d stopped", leader))
	t.Logf("leader m%d stopped: %s applied on every host in %s; CLI and readiness unaffected", leader, c, took.Round(time.Millisecond))

	// 2. A second member stops: no quorum.
	second := running[rng.IntN(len(running))]
	stop(second)
	t1 := time.Now()
	slowest := fl.waitNotReady(t, t1, 40*time.Second, "etcd")
	if err := fl.cliLeases(t); err == nil {
		t.Errorf("quorum lost: `overlayd lease list` succeeded")
	} else if !strings.Contains(err.Error(), "quorum") {
		t.Errorf("quorum lost: `overlayd lease list` fails without saying why: %v", err)
	} else {
		t.Logf("quorum lost: `overlayd lease list` fails: %v", err)
	}
	fl.dataPath(t, "quorum lost")
	lost := time.Since(t1)
	t.Logf("quorum lost (m%d and m%d stopped): every host reported not ready within %s; data path unaffected", leader, second, slowest.Round(time.Millisecond))
	back := cluster.RestartAsync(second)
	select {
	case err := <-back:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testenv.Deadline(60 * time.Second)):
		t.Fatal("m" + fmt.Sprint(second) + " did not come back in time")
	}
	running = append(running, second)
	readyIn := fl.waitReady(t, 60*time.Second)
	c = fl.churn(t, 8)
	took = converged(t, fl.f, fl.nodes, 30*time.Second)
	if err := fl.cliLeases(t); err != nil {
		t.Fatalf("quorum back: %v", err)
	}
	fl.healthy(t, "quorum back")
	t.Logf("quorum back after %s without it: every host ready %s later; %s applied in %s", lost.Round(time.Second), readyIn.Round(time.Millisecond), c, took.Round(time.Millisecond))

	// 3. The first member comes back, one never stopped goes.
	cluster.Restart(leader)
	running = append(running, leader)
	var third int
	for _, i := range []int{0, 1, 2} {
		if i != leader && i != second {
			third = i
		}
	}
	stop(third)
	t3 := time.Now()
	c = fl.churn(t, 8)
	took = converged(t, fl.f, fl.nodes, 30*time.Second)
	if err := fl.cliLeases(t); err != nil {
		t.Fatalf("m%d stopped: the CLI did not fail over: %v", third, err)
	}
	fl.healthy(t, fmt.Sprintf("m%d stopped", third))
	fl.noReadinessLoss(t, t3, fmt.Sprintf("m%d stopped", third))
	cluster.Restart(third)
	t.Logf("m%d back, m%d stopped: %s applied in %s; CLI and readiness unaffected", leader, third, c, took.Round(time.Millisecond))

	// 4. All back.
	c = fl.churn(t, 8)
	converged(t, fl.f, fl.nodes, 30*time.Second)
	fl.healthy(t, "all members back")
	sent, lostProbes := fl.ss.finish(t)
	t.Logf("cluster failover: 3 member stops (1 quorum loss), %d lease writes (+%d -%d ~%d) all applied, %d probes sent, %d lost, %s",
		fl.f.added+fl.f.removed+fl.f.changed, fl.f.added, fl.f.removed, fl.f.changed, sent, lostProbes, time.Since(start).Round(time.Second))
}

// The hosts reach the lab's single etcd through two proxies (a byte-level
// one that can cut them off or freeze their connections, and a
// message-level one that can stall watch streams):
//
//  1. etcd stops for 60 s: the data path keeps working, every host reports
//     not ready (etcd) within the liveness TTL, none exits;
//  2. etcd starts again with its data while the hosts are still cut off;
//     leases are added, removed and changed, and the history is compacted
//     ten times over (a compaction storm): when the hosts are let back,
//     their watches find their revision compacted, re-list and apply
//     exactly the difference;
//  3. every watch stream stalls silently: the progress check notices
//     within seconds and the leases changed meanwhile are applied;
//  4. every connection goes dead without closing: gRPC keepalive drops them
//     and the hosts reconnect; the leases changed meanwhile are applied.
//
// No lease is lost (same subnet, same etcd lease) and no probe dropped.
func TestEtcdOutagesAndWatchFaults(t *testing.T) {
	t.Parallel()
	const outage = 60 * time.Second
	start := time.Now()
	sd := seed(t)
	rng := rand.New(rand.NewPCG(sd, sd^0x6f7574))
	l := labtest.New(t, lab.Config{})
	dir, err := os.MkdirTemp("/tmp", "ovl-faults-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	l7, err := lab.NewGRPCProxy(filepath.Join(dir, "l7.sock"), l.Etcd.DirectEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l7.Close)
	l4, err := lab.NewProxy(filepath.Join(dir, "l4.sock"), l7.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l4.Close)
	if err := l.UseEtcd(ctxT(t, 30*time.Second), l4.Endpoint()); err != nil {
		t.Fatal(err)
	}
	cli, err := l.Etcd.DirectClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	fl := startFaultLab(t, l, etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix), rng)

	// 1. etcd stopped for 60 s.
	l4.Set(lab.ProxyDown)
	l.Etcd.Stop()
	down := time.Now()
	tick := time.NewTicker(time.Second)
	for ; time.Since(down) < outage; <-tick.C {
		fl.dataPath(t, fmt.Sprintf("etcd down %s", time.Since(down).Round(time.Second)))
	}
	tick.Stop()
	reported := fl.waitNotReady(t, down, time.Second, "etcd")
	t.Logf("etcd stopped %s: data path unaffected, every host reported not ready (etcd) within %s", outage, reported.Round(time.Millisecond))

	// 2. Back with its data, the hosts still cut off: leases change and the
	// history is compacted, then the hosts are let back.
	if err := l.Etcd.Start(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	c := fl.churn(t, 8)
	compactions := compactStorm(t, fl, cli, 3)
	l4.Set(lab.ProxyUp)
	up := time.Now()
	readyIn := fl.waitReady(t, 60*time.Second)
	converged(t, fl.f, fl.nodes, 30*time.Second)
	fl.healthy(t, "after the outage")
	t.Logf("etcd restarted with its data; %s and %d compactions while the hosts were cut off; let back: ready in %s, kernels exact %s after",
		c, compactions, readyIn.Round(time.Millisecond), time.Since(up).Round(time.Millisecond))

	// 2b. A compaction storm during a short cut: shorter than the progress
	// check, so the client resumes its watches from their last revision
	// and finds it compacted.
	before := map[string]int{}
	for _, n := range fl.nodes {
		before[n.Name] = logCount(t, n, "compacted")
	}
	l4.Set(lab.ProxyDown)
	cut := time.Now()
	n := compactStorm(t, fl, cli, 10)
	compactions += n
	l4.Set(lab.ProxyUp)
	stormFor := time.Since(cut)
	converged(t, fl.f, fl.nodes, 30*time.Second)
	took := time.Since(cut)
	for _, node := range fl.nodes {
		if logCount(t, node, "compacted") <= before[node.Name] {
			t.Errorf("%s: no watch found its revision compacted: the storm did not reach it", node.Name)
		}
	}
	fl.healthy(t, "after the compaction storm")
	t.Logf("compaction storm: %d rounds of churn and compaction in %s while cut off; every host exact %s after the cut", n, stormFor.Round(time.Millisecond), took.Round(time.Millisecond))

	// 3. Every watch stream stalls.
	before = map[string]int{}
	for _, n := range fl.nodes {
		before[n.Name] = logCount(t, n, "watch stalled")
	}
	n = l7.StallWatches()
	stalled := time.Now()
	c = fl.churn(t, 8)
	bound := 2*(etcdv3.DefaultProgressInterval+etcdv3.DefaultStallTimeout) + etcdv3.DefaultRelistSpread + testenv.Slack
	converged(t, fl.f, fl.nodes, bound)
	took = time.Since(stalled)
	for _, node := range fl.nodes {
		if logCount(t, node, "watch stalled") <= before[node.Name] {
			t.Errorf("%s: no stall was logged", node.Name)
		}
	}
	fl.healthy(t, "after the watch stall")
	t.Logf("%d watch streams stalled: %s applied on every host %s after the stall (bound %s)", n, c, took.Round(time.Millisecond), bound)

	// 4. Every connection goes dead without closing.
	l4.Set(lab.ProxyFrozen)
	frozen := time.Now()
	c = fl.churn(t, 8)
	converged(t, fl.f, fl.nodes, 60*time.Second)
	took = time.Since(frozen)
	fl.healthy(t, "after the frozen connections")
	t.Logf("connections frozen: %s applied on every host %s later (gRPC keepalive %s + %s)", c, took.Round(time.Millisecond), "10s", "5s")
	for _, ch := range fl.rd.since(frozen) {
		t.Logf("  readiness during the frozen connections: %s ready=%v at +%s: %s", ch.Node, ch.Ready, ch.At.Sub(frozen).Round(time.Millisecond), ch.Reason)
	}
	fl.waitReady(t, 60*time.Second)

	sent, lost := fl.ss.finish(t)
	t.Logf("etcd outages: 60 s stop, restart with data, %d compactions, %d stalled watch streams, frozen connections; %d lease writes (+%d -%d ~%d) all applied, %d probes sent, %d lost, %s",
		compactions, n, fl.f.added+fl.f.removed+fl.f.changed, fl.f.added, fl.f.removed, fl.f.changed, sent, lost, time.Since(start).Round(time.Second))
}

// compactStorm runs rounds of lease churn, each followed by a compaction of
// the whole history, and returns the compactions made.
func compactStorm(t *testing.T, fl *faultLab, cli *clientv3.Client, rounds int) int {
	t.Helper()
	for range rounds {
		fl.churn(t, 3)
		ctx := ctxT(t, 30*time.Second)
		resp, err := cli.Get(ctx, "compaction-probe")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
			t.Fatal(err)
		}
	}
	return rounds
}
