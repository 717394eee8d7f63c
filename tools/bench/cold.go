package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// coldRun is one cold start: K leases in etcd, overlayd started in a fresh
// host namespace, until its last route, neighbour and FDB entry appear.
type coldRun struct {
	Wall     time.Duration // exec of overlayd -> last entry notified
	CPU      time.Duration // the daemon's CPU time at that moment
	PeakRSS  int64         // VmHWM, read 1 s after convergence
	RSSAnon  int64         // then: anonymous memory (heap, stacks)
	RSSFile  int64         // then: file-backed pages (the binary)
	Notified int           // notifications the watcher parsed
}

// benchCold measures cold convergence for every K.
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
	for _, k := range b.cfg.Ks {
		var walls, cpus, rss, anon, file, rates []float64
		for run := range b.cfg.Runs {
			hostNum++
			r, err := b.coldOnce(ctx, l, cli, k, hostNum, b.cfg.Trace && run == 0)
			if err != nil {
				return fmt.Errorf("cold start K=%d run %d: %w", k, run+1, err)
			}
			b.logf("cold start K=%-5d run %d: %6.1f ms wall, %6.1f ms CPU, peak RSS %.1f MB, %d notifications",
				k, run+1, ms(r.Wall), ms(r.CPU), float64(r.PeakRSS)/1e6, r.Notified)
			walls = append(walls, secs(r.Wall))
			cpus = append(cpus, secs(r.CPU))
			rss = append(rss, float64(r.PeakRSS)/1e6)
			anon = append(anon, float64(r.RSSAnon)/1e6)
			file = append(file, float64(r.RSSFile)/1e6)
			rates = append(rates, float64(k)/r.Wall.Seconds())
		}
		p := map[string]any{"k": k}
		b.add(result{Measure: "cold_start", Metric: "wall", Unit: "s", Params: p}, walls)
		b.add(result{Measure: "cold_start", Metric: "cpu", Unit: "s", Params: p}, cpus)
		b.add(result{Measure: "cold_start", Metric: "peak_rss", Unit: "MB", Params: p}, rss)
		b.add(result{Measure: "cold_start", Metric: "rss_anon_after", Unit: "MB", Params: p}, anon)
		b.add(result{Measure: "cold_start", Metric: "rss_file_after", Unit: "MB", Params: p}, file)
		b.add(result{Measure: "cold_start", Metric: "peers_per_second", Unit: "peers/s", Params: p}, rates)
	}
	return nil
}

func (b *bench) coldOnce(ctx context.Context, l *lab.Lab, cli etcdClient, k, hostNum int, trace bool) (coldRun, error) {
	var r coldRun
	if err := resetLeases(ctx, cli); err != nil {
		return r, err
	}
	peers := synthPeers(1, k+1)
	if _, err := putLeases(ctx, cli, peers); err != nil {
		return r, err
	}
	n, err := l.AddNode(fmt.Sprintf("c%d", hostNum), hostNum)
	if err != nil {
		return r, err
	}
	defer func() {
		_ = l.RemoveNode(n)
	}()
	w, err := watchKernel(n.NS)
	if err != nil {
		return r, err
	}
	defer w.Close()
	done := w.expect(peers, true)

	start := time.Now()
	if err := n.Start(); err != nil {
		return r, err
	}
	pid := n.PID()
	at, err := w.wait(done, b.cfg.ColdTimeout)
	if err != nil {
		return r, fmt.Errorf("%w (overlayd log: %s)", err, n.LogFile)
	}
	r.Wall = at.Sub(start)
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
