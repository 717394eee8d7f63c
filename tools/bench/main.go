// Command overlay-bench is `make bench`: it measures what users of overlay
// care about, each figure repeated, and prints the medians with their range.
//
//	cold      cold start: K leases in etcd -> overlayd started in a fresh host
//	          namespace -> its last route, neighbour and FDB entry present
//	          (wall, the daemon's CPU time, its peak RSS, peers/s); with
//	          dual-stack leases too (-dual): until both devices are complete
//	events    a running daemon with a base of peers: 100 leases added in one
//	          etcd transaction, then deleted, and single lease events, timed
//	          from the write's commit to the kernel entries present (gone)
//	cni       CNI ADD/DEL latency through overlay-cni and straight to the
//	          bridge plugin with the configuration overlay-cni renders,
//	          sequential and 10 concurrent
//	net       pod-to-pod TCP throughput across hosts over host-to-host on the
//	          underlay, and round-trip times
//	restart   UDP probes lost between pods while overlayd restarts (SIGTERM,
//	          SIGKILL)
//
// Everything runs in network namespaces the lab creates and deletes (see
// internal/lab): one host namespace per simulated host on an underlay bridge
// namespace, a real etcd embedded in this process on a unix socket, the real
// overlayd and CNI binaries. Kernel state is observed through netlink
// subscriptions in the host namespace, never by polling.
//
// It builds nothing: `make bench` builds the binaries first. It needs root.
// Results go to stdout (a table) and, as JSON lines, to
// bench/results/<date>-<host>.jsonl. Documentation/benchmarks.md explains
// every figure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

type etcdClient = *clientv3.Client

// config is the command line.
type config struct {
	Root, BinDir, OutDir string
	// BinB, if set, is more directories of binaries: the cold starts
	// then alternate run by run between BinDir's overlayd (bin=a) and
	// these (bin=b, c, ...), so commits are compared in one sitting.
	BinB        []string
	Sections    []string
	Ks          []int
	DualKs      []int // peer counts of the dual-stack cold starts
	Runs        int   // repetitions of cheap figures (cold starts, streams, restarts)
	EventBase   []int
	Batches     int // 100-lease add/delete rounds
	Events      int // single add and delete events each
	CNIRuns     int // sequential ADD/DEL per mode
	CNIConc     int // concurrency of the parallel ADD/DEL
	CNIBatches  int // parallel rounds per mode
	Stream      time.Duration
	Pings       int
	ColdTimeout time.Duration
	ProfileDir  string
	Quiet       bool
	Label       string
	Trace       bool
}

var allSections = []string{"cold", "events", "cni", "net", "restart"}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("overlay-bench", flag.ContinueOnError)
	var c config
	var ks, dual, base, only string
	fs.StringVar(&c.Root, "root", ".", "repository root (for deploy/cni/10-overlay.conflist)")
	fs.StringVar(&c.BinDir, "bin", "bin", "directory with overlayd, overlay-cni and cni/ (make build plugins)")
	var binB string
	fs.StringVar(&binB, "bin-b", "", "more directories with overlayd, comma-separated: the cold starts alternate run by run between -bin's (bin=a) and these (bin=b, c, ...)")
	fs.StringVar(&c.OutDir, "out", "bench/results", "directory for the JSON lines file (\"\" writes none)")
	fs.StringVar(&only, "only", strings.Join(allSections, ","), "sections to run: "+strings.Join(allSections, ","))
	fs.StringVar(&ks, "k", "100,1000,5000,10000", "peer counts of the cold starts")
	fs.StringVar(&dual, "dual", "1000,5000", "peer counts of the dual-stack cold starts, each run alternated with an IPv4-only one at the same K (\"\": none)")
	fs.IntVar(&c.Runs, "runs", 5, "repetitions of each cold start, stream and restart")
	fs.StringVar(&base, "event-base", "1000,5000", "peers already programmed while the event figures are taken (comma-separated for several)")
	fs.IntVar(&c.Batches, "batches", 10, "rounds of 100 leases added and deleted at once")
	fs.IntVar(&c.Events, "events", 200, "single lease events (each an add and a delete)")
	fs.IntVar(&c.CNIRuns, "cni-runs", 40, "sequential CNI ADD+DEL per mode")
	fs.IntVar(&c.CNIConc, "cni-concurrency", 10, "concurrent CNI ADDs (then DELs) per round")
	fs.IntVar(&c.CNIBatches, "cni-rounds", 5, "concurrent rounds per mode")
	fs.DurationVar(&c.Stream, "stream", 3*time.Second, "duration of each TCP stream")
	fs.IntVar(&c.Pings, "pings", 100, "pings per path for the RTT")
	fs.DurationVar(&c.ColdTimeout, "cold-timeout", time.Minute, "give up on a cold start after this long")
	fs.StringVar(&c.ProfileDir, "profile", "", "instead of benchmarking, write CPU and heap profiles of overlayd's cold path and event path (run in-process) to this directory")
	fs.BoolVar(&c.Quiet, "q", false, "no progress lines on stderr")
	fs.BoolVar(&c.Trace, "trace", false, "print the daemon's log of the first cold start of each K, with times from its exec")
	fs.StringVar(&c.Label, "label", "", "a note stored with every result (e.g. which binaries were measured)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for dir := range strings.SplitSeq(binB, ",") {
		if dir = strings.TrimSpace(dir); dir != "" {
			c.BinB = append(c.BinB, dir)
		}
	}
	var err error
	if c.Ks, err = intList(ks); err != nil {
		return c, fmt.Errorf("-k: %w", err)
	}
	if c.DualKs, err = intList(dual); err != nil {
		return c, fmt.Errorf("-dual: %w", err)
	}
	if c.EventBase, err = intList(base); err != nil {
		return c, fmt.Errorf("-event-base: %w", err)
	}
	for _, k := range slices.Concat(c.Ks, c.DualKs, c.EventBase) {
		if k < 0 || k+c.Events+200 > maxPeers {
			return c, fmt.Errorf("peer count %d out of range 0..%d", k, maxPeers-c.Events-200)
		}
	}
	for s := range strings.SplitSeq(only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(allSections, s) {
			return c, fmt.Errorf("-only: unknown section %q (have %s)", s, strings.Join(allSections, ","))
		}
		c.Sections = append(c.Sections, s)
	}
	if c.Runs < 1 || c.Batches < 1 || c.Events < 1 || c.CNIRuns < 1 || c.CNIConc < 1 || c.CNIBatches < 1 || c.Pings < 1 {
		return c, errors.New("repetition counts must be at least 1")
	}
	return c, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// result is one figure: a JSON line and a row of the detail table.
type result struct {
	Measure string         `json:"measure"`
	Metric  string         `json:"metric"`
	Unit    string         `json:"unit"`
	Params  map[string]any `json:"params,omitempty"`
	summary
	Samples []float64 `json:"samples"`
}

// runInfo is written with every JSON line.
type runInfo struct {
	Run       string `json:"run"` // start time, RFC 3339
	Host      string `json:"host"`
	Commit    string `json:"commit"`
	Go        string `json:"go"`
	Kernel    string `json:"kernel"`
	CPUs      int    `json:"cpus"`
	CPU       string `json:"cpuModel"`
	LoadStart string `json:"loadStart"`
	LoadEnd   string `json:"loadEnd,omitempty"`
	// With -bin-b: `overlayd version` of each binary measured, by its
	// name (bin=a, b, ...).
	Binaries map[string]string `json:"binaries,omitempty"`
	Label    string            `json:"label,omitempty"`
}

type bench struct {
	cfg     config
	info    runInfo
	results []result
	errs    map[string]error // section -> why it failed
	log     io.Writer
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, format+"\n", args...)
}

func (b *bench) add(r result, samples []float64) {
	r.summary = summarize(samples, len(samples) >= 20)
	r.Samples = samples
	b.results = append(b.results, r)
}

// find returns the figure measure/metric with the given params. A figure
// with a family (a dual-stack cold start) is found only by a query that
// names it: the IPv4-only figure of the same measure and K has none. A
// figure of the second binary (bin=b, -bin-b) is found only by a query
// that names it too: the headlines are the first binary's.
func (b *bench) find(measure, metric string, params ...any) (result, bool) {
	for _, r := range b.results {
		if r.Measure != measure || r.Metric != metric {
			continue
		}
		_, unnamedFamily := r.Params["family"]
		bin, hasBin := r.Params["bin"]
		unnamedB := hasBin && bin != binA
		match := true
		for i := 0; i+1 < len(params); i += 2 {
			switch params[i] {
			case "family":
				unnamedFamily = false
			case "bin":
				unnamedB = false
			}
			if fmt.Sprint(r.Params[params[i].(string)]) != fmt.Sprint(params[i+1]) {
				match = false
			}
		}
		if match && !unnamedFamily && !unnamedB {
			return r, true
		}
	}
	return result{}, false
}

func (b *bench) newLab(ctx context.Context, tag, network string) (*lab.Lab, error) {
	return lab.New(ctx, lab.Config{
		Root:          b.cfg.Root,
		BinDir:        b.cfg.BinDir,
		Tag:           tag,
		NetworkConfig: network,
		// overlayd's production defaults: the lab's 1 s kernel resync and
		// debug logs are for tests.
		KernelResync: 30 * time.Second,
		LogLevel:     "info",
	})
}

// main checks the flags and the paths, runs the sections asked for and
// writes the tables and results. It is long (over 80 lines) as a
// program's outline is: each step runs once, in order, on one bench.
func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "overlay-bench:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "overlay-bench needs root to create network namespaces: sudo make bench")
		os.Exit(1)
	}
	paths := []*string{&cfg.Root, &cfg.BinDir}
	for i := range cfg.BinB {
		paths = append(paths, &cfg.BinB[i])
	}
	for _, p := range paths {
		if *p, err = filepath.Abs(*p); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// Ctrl-C cancels; the labs then remove their namespaces.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{cfg: cfg, errs: map[string]error{}, log: os.Stderr}
	if cfg.Quiet {
		b.log = io.Discard
	}
	b.info = newRunInfo(cfg.Root)
	b.info.Label = cfg.Label
	if len(cfg.BinB) > 0 {
		b.info.Binaries = map[string]string{binA: binaryVersion(cfg.BinDir)}
		for i, dir := range cfg.BinB {
			b.info.Binaries[binName(i+1)] = binaryVersion(dir)
		}
	}
	if cfg.ProfileDir != "" {
		if err := b.profile(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "overlay-bench: profile:", err)
			os.Exit(1)
		}
		return
	}
	b.logf("overlay-bench: %s, %d CPUs (%s), kernel %s, load average %s",
		b.info.Host, b.info.CPUs, b.info.CPU, b.info.Kernel, b.info.LoadStart)
	sections := map[string]func(context.Context) error{
		"cold": b.benchCold, "events": b.benchEvents, "cni": b.benchCNI, "net": b.benchNet, "restart": b.benchRestart,
	}
	for _, s := range cfg.Sections {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		b.logf("== %s", s)
		if err := sections[s](ctx); err != nil {
			b.errs[s] = err
			b.logf("== %s FAILED: %v", s, err)
			continue
		}
		b.logf("== %s done in %s", s, time.Since(start).Round(100*time.Millisecond))
	}
	b.info.LoadEnd = loadAvg()
	b.printTables(os.Stdout)
	if cfg.OutDir != "" {
		path, err := b.writeJSON()
		if err != nil {
			fmt.Fprintln(os.Stderr, "overlay-bench:", err)
			os.Exit(1)
		}
		fmt.Printf("\nresults appended to %s\n", path)
		if slices.Contains(cfg.Sections, "cold") {
			svg := strings.TrimSuffix(path, ".jsonl") + "-cold-start.svg"
			if err := b.plotCold(svg); err != nil {
				fmt.Fprintln(os.Stderr, "overlay-bench: plot:", err)
			} else {
				fmt.Printf("cold-start plot written to %s\n", svg)
			}
		}
	}
	if len(b.errs) > 0 || ctx.Err() != nil {
		os.Exit(1)
	}
}

// binaryVersion is what `overlayd version` of dir's overlayd prints.
func binaryVersion(dir string) string {
	out, err := exec.Command(filepath.Join(dir, "overlayd"), "version").Output()
	if err != nil {
		return fmt.Sprintf("%s (version: %v)", dir, err)
	}
	return dir + ": " + strings.TrimSpace(string(out))
}

func newRunInfo(root string) runInfo {
	host, _ := os.Hostname()
	info := runInfo{Run: time.Now().UTC().Format(time.RFC3339), Host: host, Go: runtime.Version(),
		CPUs: runtime.NumCPU(), CPU: cpuModel(), LoadStart: loadAvg(), Commit: "unknown", Kernel: "unknown"}
	if out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output(); err == nil {
		info.Commit = strings.TrimSpace(string(out))
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var b strings.Builder
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		info.Kernel = b.String()
	}
	return info
}

// writeJSON appends one line per figure to <out>/<date>-<host>.jsonl.
func (b *bench) writeJSON() (string, error) {
	if err := os.MkdirAll(b.cfg.OutDir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(b.cfg.OutDir, time.Now().UTC().Format("2006-01-02")+"-"+b.info.Host+".jsonl")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	type line struct {
		runInfo
		result
	}
	for _, r := range b.results {
		for i, v := range r.Samples {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				r.Samples[i] = -1
			}
		}
		if err := enc.Encode(line{b.info, r}); err != nil {
			return "", err
		}
	}
	for s, err := range b.errs {
		if err := enc.Encode(line{b.info, result{Measure: s, Metric: "error", Unit: err.Error()}}); err != nil {
			return "", err
		}
	}
	return path, f.Close()
}
