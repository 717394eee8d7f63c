package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// coldRun is one cold start: K leases in etcd, overlayd started in a fresh
// host namespace, until its last route, neighbour and FDB entry appear (on
// both devices in a dual-stack cluster).
type coldRun struct {
	Wall     time.Duration // exec of overlayd -> last entry notified
	CPU      time.Duration // the daemon's CPU time at that moment
	PeakRSS  int64         // VmHWM, read 1 s after convergence
	RSSAnon  int64         // then: anonymous memory (heap, stacks)
	RSSFile  int64         // then: file-backed pages (the binary)
	Notified int           // notifications the watcher parsed
	// Dual stack only: exec -> the last IPv4 entry, and the last IPv6 one.
	IPv4, IPv6 time.Duration
}

// coldSeries collects the runs of one K and stack.
type coldSeries struct {
	walls, cpus, rss, anon, file, rates, v4, v6 []float64
}

func (c *coldSeries) addRun(k int, r coldRun) {
	c.walls = append(c.walls, secs(r.Wall))
	c.cpus = append(c.cpus, secs(r.CPU))
	c.rss = append(c.rss, float64(r.PeakRSS)/1e6)
	c.anon = append(c.anon, float64(r.RSSAnon)/1e6)
	c.file = append(c.file, float64(r.RSSFile)/1e6)
	c.rates = append(c.rates, float64(k)/r.Wall.Seconds())
	c.v4 = append(c.v4, secs(r.IPv4))
	c.v6 = append(c.v6, secs(r.IPv6))
}

// binA names -bin's overlayd when cold starts compare binaries (-bin-b):
// bin=a; those of -bin-b are b, c, ... in order. Without -bin-b the
// figures have no bin.
const binA = "a"

// binName is the name of the i-th binary compared (0 is -bin's).
func binName(i int) string { return string(rune('a' + i)) }

// coldBinary is one overlayd a cold start runs.
type coldBinary struct {
	name     string // binName, or "" when only one is measured
	overlayd string // path; "" is the lab's
}

// coldBinaries is the binaries the cold starts run, in the order of the
// first run (the order rotates from run to run).
func (b *bench) coldBinaries() []coldBinary {
	if len(b.cfg.BinB) == 0 {
		return []coldBinary{{}}
	}
	bins := []coldBinary{{name: binA}}
	for i, dir := range b.cfg.BinB {
		bins = append(bins, coldBinary{name: binName(i + 1), overlayd: filepath.Join(dir, "overlayd")})
	}
	return bins
}

// coldStacks is the stacks a cold start of K peers runs with: IPv4 only,
// and dual stack too if K is in -dual (a dual-stack figure is always taken
// beside the IPv4-only one it is compared with).
func (b *bench) coldStacks(k int) []stack {
	if slices.Contains(b.cfg.DualKs, k) {
		return []stack{ipv4Only, dualStack}
	}
	return []stack{ipv4Only}
}

// benchCold measures cold convergence for every K: IPv4 only (-k and
// -dual) and dual stack (-dual). At a K measured both ways the runs
// alternate, IPv4 only first, so that both see the same machine. With
// -bin-b every run is taken with every binary, in an order that rotates
// from run to run (a b, then b a; a b c, then b c a, then c a b), so that
// none always follows another.
func (b *bench) benchCold(ctx context.Context) error {
	l, err := b.newLab(ctx, "cold", benchNetwork)
	if err != nil {
		return err
	}
	defer l.Close()
	cli, err := l.Etcd.Client()
	if err != nil {
		return err
	}
	defer cli.Close()

	hostNum := 0
	bins := b.coldBinaries()
	ks := b.coldKs()
	// series[K][stack][binary]
	all := make([][][]coldSeries, len(ks))
	for ki, k := range ks {
		stacks := b.coldStacks(k)
		series := make([][]coldSeries, len(stacks))
		for i := range series {
			series[i] = make([]coldSeries, len(bins))
		}
		for run := range b.cfg.Runs {
			for i, s := range stacks {
				for j := range bins {
					j = (j + run) % len(bins)
					bin := bins[j]
					hostNum++
					r, err := b.coldOnce(ctx, l, cli, s, k, hostNum, bin.overlayd, b.cfg.Trace && run == 0)
					if err != nil {
						return fmt.Errorf("cold start K=%d (%s%s) run %d: %w", k, s, binNote(bin.name), run+1, err)
					}
					family := ""
					if s == dualStack {
						family = fmt.Sprintf(" (dual stack: IPv4 %.1f ms, IPv6 %.1f ms)", ms(r.IPv4), ms(r.IPv6))
					}
					b.logf("cold start K=%-5d run %d%s: %6.1f ms wall, %6.1f ms CPU, peak RSS %.1f MB, %d notifications%s",
						k, run+1, binNote(bin.name), ms(r.Wall), ms(r.CPU), float64(r.PeakRSS)/1e6, r.Notified, family)
					series[i][j].addRun(k, r)
				}
			}
		}
		for i, s := range stacks {
			for j, bin := range bins {
				b.addCold(k, s, bin.name, series[i][j])
			}
		}
		all[ki] = series
	}
	// The cost of one more peer: the slope of the IPv4-only medians
	// between the smallest and the largest K (the fixed cost of a start,
	// ~20 MB and tens of ms, drops out).
	lo, hi := 0, 0
	for i, k := range ks {
		if k < ks[lo] {
			lo = i
		}
		if k > ks[hi] {
			hi = i
		}
	}
	if ks[hi] > ks[lo] {
		for j, bin := range bins {
			b.addMarginal(ks[lo], ks[hi], bin.name, all[lo][0][j], all[hi][0][j])
		}
	}
	return nil
}

func binNote(name string) string {
	if name == "" {
		return ""
	}
	return " bin=" + name
}

// coldKs is every K of -k, then those of -dual not in -k.
func (b *bench) coldKs() []int {
	ks := slices.Clone(b.cfg.Ks)
	for _, k := range b.cfg.DualKs {
		if !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	return ks
}

// addCold records the figures of one K and stack. IPv4-only figures have
// the parameter k alone (as they always had); dual-stack ones also
// family=dual, and the times at which each device was complete.
func (b *bench) addCold(k int, s stack, bin string, c coldSeries) {
	p := map[string]any{"k": k}
	if s == dualStack {
		p["family"] = s.String()
	}
	if bin != "" {
		p["bin"] = bin
	}
	b.add(result{Measure: "cold_start", Metric: "wall", Unit: "s", Params: p}, c.walls)
	b.add(result{Measure: "cold_start", Metric: "cpu", Unit: "s", Params: p}, c.cpus)
	b.add(result{Measure: "cold_start", Metric: "peak_rss", Unit: "MB", Params: p}, c.rss)
	b.add(result{Measure: "cold_start", Metric: "rss_anon_after", Unit: "MB", Params: p}, c.anon)
	b.add(result{Measure: "cold_start", Metric: "rss_file_after", Unit: "MB", Params: p}, c.file)
	b.add(result{Measure: "cold_start", Metric: "peers_per_second", Unit: "peers/s", Params: p}, c.rates)
	// Per peer: everything the start cost, fixed part included, divided
	// by K (cold_start_marginal has the cost of one more peer).
	perPeer := func(xs []float64, scale float64) []float64 {
		out := make([]float64, len(xs))
		for i, x := range xs {
			out[i] = x * scale / float64(k)
		}
		return out
	}
	b.add(result{Measure: "cold_start", Metric: "cpu_per_peer", Unit: "µs", Params: p}, perPeer(c.cpus, 1e6))
	b.add(result{Measure: "cold_start", Metric: "peak_rss_per_peer", Unit: "B", Params: p}, perPeer(c.rss, 1e6))
	if s == dualStack {
		b.add(result{Measure: "cold_start", Metric: "ipv4_device_complete", Unit: "s", Params: p}, c.v4)
		b.add(result{Measure: "cold_start", Metric: "ipv6_device_complete", Unit: "s", Params: p}, c.v6)
	}
}

// addMarginal records what one more peer costs a cold start: the
// difference of the medians at K = hi and K = lo over hi - lo.
func (b *bench) addMarginal(lo, hi int, bin string, a, z coldSeries) {
	p := map[string]any{"k_from": lo, "k_to": hi}
	if bin != "" {
		p["bin"] = bin
	}
	slope := func(xa, xz []float64, scale float64) []float64 {
		return []float64{(summarize(xz, false).Median - summarize(xa, false).Median) * scale / float64(hi-lo)}
	}
	b.add(result{Measure: "cold_start_marginal", Metric: "cpu_per_peer", Unit: "µs", Params: p}, slope(a.cpus, z.cpus, 1e6))
	b.add(result{Measure: "cold_start_marginal", Metric: "peak_rss_per_peer", Unit: "B", Params: p}, slope(a.rss, z.rss, 1e6))
	b.add(result{Measure: "cold_start_marginal", Metric: "rss_anon_per_peer", Unit: "B", Params: p}, slope(a.anon, z.anon, 1e6))
}

func (b *bench) coldOnce(ctx context.Context, l *lab.Lab, cli etcdClient, s stack, k, hostNum int, overlayd string, trace bool) (coldRun, error) {
	var r coldRun
	if err := resetLeases(ctx, cli); err != nil {
		return r, err
	}
	if err := useNetwork(ctx, cli, s); err != nil {
		return r, err
	}
	v4, v6, err := seedLeases(ctx, cli, s, k)
	if err != nil {
		return r, err
	}
	n, err := l.AddNode(fmt.Sprintf("c%d", hostNum), hostNum)
	if err != nil {
		return r, err
	}
	defer func() {
		_ = l.RemoveNode(n)
	}()
	n.Overlayd = overlayd
	w, err := watchKernel(n.NS)
	if err != nil {
		return r, err
	}
	defer w.Close()
	// One expectation per device: the run is complete when both are.
	done4 := w.expect(v4, true)
	var done6 <-chan time.Time
	if s == dualStack {
		done6 = w.expect(v6, true)
	}

	start := time.Now()
	if err := n.Start(); err != nil {
		return r, err
	}
	pid := n.PID()
	at, err := w.wait(done4, b.cfg.ColdTimeout)
	if err != nil {
		return r, fmt.Errorf("IPv4 entries: %w (overlayd log: %s)", err, n.LogFile)
	}
	if done6 != nil {
		at6, err := w.wait(done6, max(time.Second, b.cfg.ColdTimeout-time.Since(start)))
		if err != nil {
			return r, fmt.Errorf("IPv6 entries: %w (overlayd log: %s)", err, n.LogFile)
		}
		r.IPv4, r.IPv6 = at.Sub(start), at6.Sub(start)
		at = latest(at, at6)
	}
	r.Wall = at.Sub(start)
	// The CPU time is read once both devices are complete (the later
	// wait returns at once if its notification came first).
	if r.CPU, err = procCPU(pid); err != nil {
		return r, err
	}
	r.Notified = w.Messages()
	// What the daemon does right after converging (logging, GC, the
	// watch starting) belongs to its peak too.
	time.Sleep(time.Second)
	if r.PeakRSS, _, err = procMem(pid); err != nil {
		return r, err
	}
	if r.RSSAnon, r.RSSFile, err = procRSS(pid); err != nil {
		return r, err
	}
	if trace {
		b.traceLog(n.LogFile, start, at)
	}
	if err := n.Stop(syscall.SIGTERM); err != nil {
		return r, err
	}
	return r, nil
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// traceLog prints the daemon's log lines with their time from the exec of
// overlayd (start); the kernel entries were all present at done.
func (b *bench) traceLog(path string, start, done time.Time) {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.logf("trace: %v", err)
		return
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		ts, rest, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil {
			continue
		}
		b.logf("  %+7.1f ms  %s", ms(t.Sub(start)), rest)
	}
	b.logf("  %+7.1f ms  (last kernel entry notified)", ms(done.Sub(start)))
}
