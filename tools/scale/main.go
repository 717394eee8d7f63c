// Command scale measures overlay's control plane at N hosts (issue #18,
// Documentation/scale.md): N simulated hosts, each with its own etcd client
// and the production subnet/etcdv3 Manager and Registry.Watch (the kernel
// side replaced by a recorder), against a real 3-member etcd cluster whose
// members are processes of their own on loopback. Hosts run in worker
// processes of at most -per hosts each (the open-files limit). It prints a
// table and appends JSON lines to bench/results/<date>-<host>-scale.jsonl.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type config struct {
	Ns        []int
	Runs      int
	Per       int
	Steady    time.Duration
	Scenarios string
	Proxied   float64
	Partition time.Duration
	Out       string
	Plot      string
	// WorkerGOGC is the workers' garbage-collection target (debug.SetGCPercent).
	WorkerGOGC int
	// Source is the lease source the hosts run: etcd (etcdv3.Source
	// against three members) or kube (kube.Source against a
	// kube-apiserver and its etcd from bin/kube).
	Source  string
	KubeBin string
	// KubeletStatus is how often each simulated Node's status is
	// reported as a kubelet reports it (0: never).
	KubeletStatus time.Duration
}

func main() {
	role := flag.String("role", "", "internal: member or worker")
	dir := flag.String("dir", "", "internal: cluster directory")
	idx := flag.Int("i", 0, "internal: member index")
	proxied := flag.Float64("proxied-share", 0, "internal: share of the worker's hosts behind proxies")
	ports := flag.String("ports", "", "internal: peer ports")
	state := flag.String("state", "new", "internal: cluster state")
	first := flag.Int("from", 0, "internal: first host")
	end := flag.Int("to", 0, "internal: end of hosts")
	gogc := flag.Int("gogc", 50, "internal: the worker's garbage-collection target")
	ns := flag.String("n", "1000", "numbers of simulated hosts, comma-separated")
	var c config
	flag.StringVar(&c.Source, "source", "etcd", "the simulated hosts' lease source: etcd (three etcd members) or kube (a kube-apiserver and its etcd, from -kube-bin; the scenarios are etcd's and are not run)")
	flag.StringVar(&c.KubeBin, "kube-bin", "bin/kube", "with -source kube: the directory of `make kube`'s etcd and kube-apiserver")
	flag.DurationVar(&c.KubeletStatus, "kubelet-status", 5*time.Minute, "with -source kube: after a steady window of the hosts alone, a second one with each Node's status reported this often, as a kubelet does (its nodeStatusReportFrequency; 0: no second window); the joins are measured with these reports going on")
	flag.IntVar(&c.Runs, "runs", 3, "repetitions of each join measurement")
	flag.IntVar(&c.Per, "per", 2500, "hosts per worker process (each host holds 3 connections; the open-files limit is per process)")
	flag.DurationVar(&c.Steady, "steady", 30*time.Second, "steady-state sampling window")
	flag.StringVar(&c.Scenarios, "scenarios", "churn,leader,partition,compact,restart", "scenarios to run, in order: churn, leader, partition, compact, restart")
	flag.Float64Var(&c.Proxied, "proxied", 0.3, "with partition or compact: the share of hosts (in tenths) that reach etcd through proxies the scenarios cut")
	flag.DurationVar(&c.Partition, "partition", time.Minute, "how long the partition scenario isolates the proxied hosts")
	flag.StringVar(&c.Out, "out", "bench/results", "directory for the JSON lines (\"\" writes none)")
	flag.StringVar(&c.Plot, "plot", "", "write an SVG of the join latency and etcd memory against N here")
	flag.IntVar(&c.WorkerGOGC, "worker-gogc", 50, "the worker processes' GOGC: below Go's 100 because their heap grows as N²; each collection scans every simulated host's heap, a cost no real host pays")
	from := flag.String("plot-from", "", "instead of measuring, plot the JSON lines of this file (with -plot)")
	flag.Parse()
	var err error
	switch {
	case *role == "member":
		err = runMember(*dir, *idx, parseInts(*ports), *state)
	case *role == "worker":
		err = runWorker(c.Source, flag.Args(), *first, *end, *proxied, *dir, *gogc)
	case *from != "":
		err = replot(c, *from)
	case c.Source != "etcd" && c.Source != "kube":
		err = fmt.Errorf("-source %q: want etcd or kube", c.Source)
	default:
		c.Ns = parseInts(*ns)
		err = run(c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func parseInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if v, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// result is one figure at one N, over the runs.
type result struct {
	N      int     `json:"n"`
	Figure string  `json:"figure"`
	Unit   string  `json:"unit"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	Runs   int     `json:"runs"`
	Note   string  `json:"note,omitempty"`
}

type coordinator struct {
	cfg       config
	results   []result
	lastWrite time.Time
}

func run(cfg config) error {
	c := &coordinator{cfg: cfg}
	for _, n := range cfg.Ns {
		if err := c.measure(n); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
	}
	if cfg.Plot != "" {
		return os.WriteFile(cfg.Plot, []byte(c.svg()), 0o644)
	}
	return nil
}

// replot draws the SVG of earlier runs' JSON lines.
func replot(cfg config, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c := &coordinator{cfg: cfg}
	c.cfg.Ns = nil
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		c.results = append(c.results, r)
		if !slices.Contains(c.cfg.Ns, r.N) {
			c.cfg.Ns = append(c.cfg.Ns, r.N)
		}
	}
	slices.Sort(c.cfg.Ns)
	return os.WriteFile(cfg.Plot, []byte(c.svg()), 0o644)
}

func (c *coordinator) add(n int, figure, unit string, vals []float64, note string) {
	if len(vals) == 0 {
		return
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	r := result{N: n, Figure: figure, Unit: unit, Median: s[len(s)/2], Max: s[len(s)-1], Runs: len(s), Note: note}
	c.results = append(c.results, r)
	if err := c.record(r); err != nil {
		fmt.Fprintln(os.Stderr, "scale: recording a result:", err)
	}
	fmt.Printf("N=%-6d %-34s median %10.3f  max %10.3f %s  (%d)%s\n", n, figure, r.Median, r.Max, unit, r.Runs, map[bool]string{true: "  " + note}[note != ""])
}

func mb(bs []int64) []float64 {
	var out []float64
	for _, b := range bs {
		out = append(out, float64(b)/1e6)
	}
	return out
}

func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// record appends r to bench/results/<date>-<host>-scale.jsonl (-out) as it
// is measured, so a run stopped part-way keeps what it measured.
func (c *coordinator) record(r result) error {
	if c.cfg.Out == "" {
		return nil
	}
	host, _ := os.Hostname()
	if err := os.MkdirAll(c.cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(c.cfg.Out, time.Now().UTC().Format("2006-01-02")+"-"+host+"-scale.jsonl")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	line := struct {
		result
		Time       string `json:"time"`
		CPUs       int    `json:"cpus"`
		WorkerGOGC int    `json:"worker_gogc"`
		// Source is "kube" for -source kube (etcd's lines have none).
		Source string `json:"source,omitempty"`
	}{r, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), c.cfg.WorkerGOGC, map[bool]string{true: "kube"}[c.cfg.Source == "kube"]}
	err = json.NewEncoder(f).Encode(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// atN is one N's measurement: its cluster, its hosts' workers, and the
// numbering of the probe leases written so far.
type atN struct {
	c *coordinator
	n int
	// eps and dir tell the workers where the control plane is and where
	// the run's files are.
	eps []string
	dir string
	// cl, admin and reg are etcd's (-source etcd); kapi is the API
	// server's (-source kube).
	cl    *cluster
	admin *clientv3.Client
	reg   *etcdv3.Registry
	kapi  *kubeAPI
	ws    []*workerProc
	probe int
}

// measure runs everything at N hosts on a fresh cluster: the hosts' start,
// the steady state, joins, then the scenarios.
func (c *coordinator) measure(n int) error {
	if c.cfg.Source == "kube" {
		return c.measureKube(n)
	}
	fmt.Printf("== N=%d: starting a 3-member etcd cluster\n", n)
	cl, err := startCluster()
	if err != nil {
		return err
	}
	defer cl.close()
	admin, err := clientv3.New(clientv3.Config{Endpoints: cl.eps, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer admin.Close()
	m := &atN{c: c, n: n, eps: cl.eps, dir: cl.dir, cl: cl, admin: admin, reg: etcdv3.NewRegistry(admin, prefix), probe: 20000}
	if _, err := m.reg.PutConfig(context.Background(), []byte(`{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`)); err != nil {
		return err
	}
	defer m.stopWorkers()
	for _, step := range []func() error{m.startHosts, m.steady, m.joins, m.scenarios} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func (m *atN) add(figure, unit string, vals []float64, note string) {
	m.c.add(m.n, figure, unit, vals, note)
}

// startHosts starts the workers and waits until every host holds its lease
// and watches.
func (m *atN) startHosts() error {
	// Proxies only where a scenario cuts them: they copy every byte.
	proxied := 0.0
	if m.cl != nil && (strings.Contains(m.c.cfg.Scenarios, "partition") || strings.Contains(m.c.cfg.Scenarios, "compact")) {
		proxied = m.c.cfg.Proxied
	}
	t0 := time.Now()
	for from := 0; from < m.n; from += m.c.cfg.Per {
		w, err := startWorker(m.c.cfg.Source, m.eps, from, min(m.n, from+m.c.cfg.Per), proxied, m.dir, m.c.cfg.WorkerGOGC)
		if err != nil {
			return err
		}
		m.ws = append(m.ws, w)
	}
	started, err := all[map[string]any](m.ws, "")
	if err != nil {
		return err
	}
	fmt.Printf("   per host (connect, config, node ID, acquire), s: %v\n", started[0]["step_secs"])
	fmt.Printf("== N=%d: all hosts hold leases after %s\n", m.n, time.Since(t0).Round(time.Second))
	m.add("start all hosts", "s", []float64{time.Since(t0).Seconds()}, "")
	return nil
}

func (m *atN) stopWorkers() {
	for _, w := range m.ws {
		_ = w.send("quit")
		_ = w.pin.Close()
		done := make(chan struct{})
		go func() { _ = w.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = w.cmd.Process.Kill()
		}
	}
}

// steady samples what the hosts send, etcd's CPU and memory and the hosts'
// memory over the steady-state window.
func (m *atN) steady() error {
	time.Sleep(5 * time.Second)
	s0, err := stats(m.ws)
	if err != nil {
		return err
	}
	cpu0, _ := m.cl.usage()
	time.Sleep(m.c.cfg.Steady)
	s1, err := stats(m.ws)
	if err != nil {
		return err
	}
	cpu1, rss := m.cl.usage()
	secs, n := m.c.cfg.Steady.Seconds(), float64(m.n)
	var total float64
	var detail []string
	for k, v := range s1.rpcs {
		d := float64(v-s0.rpcs[k]) / secs / n
		total += d
		if d > 0 {
			detail = append(detail, fmt.Sprintf("%s=%.3f", k[strings.LastIndexByte(k, '/')+1:], d))
		}
	}
	slices.Sort(detail)
	m.add("steady rpcs per host", "1/s", []float64{total}, strings.Join(detail, " "))
	m.add("steady etcd cpu (3 members)", "cores", []float64{cpuSince(cpu0, cpu1, secs)}, "")
	m.add("steady etcd rss per member", "MB", mb(rss), "")
	m.addSimMemory(s1)
	return nil
}

// addSimMemory adds what the simulated hosts hold, per host.
func (m *atN) addSimMemory(s sum) {
	m.add("sim heap per host", "KB", []float64{s.heap / float64(m.n) / 1024}, "")
	m.add("sim rss per host", "KB", []float64{s.rss / float64(m.n) / 1024}, "")
}

// joins writes -runs joining hosts' leases, one at a time, and notes when
// each reached every host.
func (m *atN) joins() error { return m.joinsNamed("join seen by all", 10000) }

// joinsNamed is joins with the figures named what and the probes
// numbered from first: each series of joins needs probes of its own, as a
// host notes when it first saw a subnet.
func (m *atN) joinsNamed(what string, first int) error {
	var p50, p99, pmax []float64
	for r := range m.c.cfg.Runs {
		lat, missing, err := m.join(first + r)
		if err != nil {
			return err
		}
		if missing > 0 {
			fmt.Printf("   join %d: %d hosts did not see it within 30 s\n", r, missing)
		}
		p50, p99, pmax = append(p50, pct(lat, 0.5)), append(p99, pct(lat, 0.99)), append(pmax, pct(lat, 1))
	}
	m.add(what+": p50", "ms", p50, "")
	m.add(what+": p99", "ms", p99, "")
	m.add(what+": max", "ms", pmax, "")
	return nil
}
