// Command scale measures overlay's control plane at N hosts (issue #18,
// Documentation/scale.md): N simulated hosts, each with its own etcd client
// and the production subnet/etcdv3 Manager and Registry.Watch (the kernel
// side replaced by a recorder), against a real 3-member etcd cluster whose
// members are processes of their own on loopback. Hosts run in worker
// processes of at most -per hosts each (the open-files limit). It prints a
// table and appends JSON lines to bench/results/<date>-<host>-scale.jsonl.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/overlaynet/overlay/subnet"
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
	ns := flag.String("n", "1000", "numbers of simulated hosts, comma-separated")
	var c config
	flag.IntVar(&c.Runs, "runs", 3, "repetitions of each join measurement")
	flag.IntVar(&c.Per, "per", 2500, "hosts per worker process (each host holds 3 connections; the open-files limit is per process)")
	flag.DurationVar(&c.Steady, "steady", 30*time.Second, "steady-state sampling window")
	flag.StringVar(&c.Scenarios, "scenarios", "churn,leader,partition,compact,restart", "scenarios to run, in order: churn, leader, partition, compact, restart")
	flag.Float64Var(&c.Proxied, "proxied", 0.3, "with partition or compact: the share of hosts (in tenths) that reach etcd through proxies the scenarios cut")
	flag.DurationVar(&c.Partition, "partition", time.Minute, "how long the partition scenario isolates the proxied hosts")
	flag.StringVar(&c.Out, "out", "bench/results", "directory for the JSON lines (\"\" writes none)")
	flag.StringVar(&c.Plot, "plot", "", "write an SVG of the join latency and etcd memory against N here")
	from := flag.String("plot-from", "", "instead of measuring, plot the JSON lines of this file (with -plot)")
	flag.Parse()
	var err error
	switch {
	case *role == "member":
		err = runMember(*dir, *idx, parseInts(*ports), *state)
	case *role == "worker":
		err = runWorker(flag.Args(), *first, *end, *proxied, *dir)
	case *from != "":
		err = replot(c, *from)
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
		if err := os.WriteFile(cfg.Plot, []byte(c.svg()), 0o644); err != nil {
			return err
		}
	}
	return c.write()
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
	fmt.Printf("N=%-6d %-34s median %10.3f  max %10.3f %s  (%d)%s\n", n, figure, r.Median, r.Max, unit, r.Runs, map[bool]string{true: "  " + note}[note != ""])
}

// cluster is three etcd member processes.
type cluster struct {
	dir   string
	ports []int
	procs []*exec.Cmd
	eps   []string
}

func startCluster() (*cluster, error) {
	dir, err := os.MkdirTemp("/tmp", "scale")
	if err != nil {
		return nil, err
	}
	cl := &cluster{dir: dir, procs: make([]*exec.Cmd, 3)}
	// Free loopback ports for the peers: all three are held open until
	// picked, so they differ, then released for the members.
	var lns []net.Listener
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		cl.ports = append(cl.ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	for i := range 3 {
		cl.eps = append(cl.eps, "unix://"+filepath.Join(dir, memberName(i)+".sock"))
	}
	errs := make(chan error, 3)
	for i := range 3 {
		go func() { errs <- cl.start(i, "new") }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			cl.close()
			return nil, err
		}
	}
	return cl, nil
}

func (cl *cluster) start(i int, state string) error {
	var ps []string
	for _, p := range cl.ports {
		ps = append(ps, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-role", "member", "-dir", cl.dir, "-i", strconv.Itoa(i), "-ports", strings.Join(ps, ","), "-state", state)
	// Members log to a file: a stopped member's shutdown is noisy.
	logf, err := os.OpenFile(filepath.Join(cl.dir, memberName(i)+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	cl.procs[i] = cmd
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("etcd member %d did not start: %v", i, err)
	}
	return nil
}

func (cl *cluster) stop(i int) {
	if p := cl.procs[i]; p != nil {
		_ = p.Process.Signal(syscall.SIGTERM)
		_ = p.Wait()
		cl.procs[i] = nil
	}
}

func (cl *cluster) close() {
	for i := range cl.procs {
		cl.stop(i)
	}
	_ = os.RemoveAll(cl.dir)
}

// usage returns each running member's CPU seconds (by PID) and RSS.
func (cl *cluster) usage() (cpu map[int]float64, rss []int64) {
	cpu = map[int]float64{}
	for _, p := range cl.procs {
		if p != nil {
			cpu[p.Process.Pid] = procCPU(p.Process.Pid)
			rss = append(rss, procRSS(p.Process.Pid))
		}
	}
	return cpu, rss
}

// cpuSince is the CPU the members running at both samples used between
// them (a member stopped in between is left out), in cores.
func cpuSince(a, b map[int]float64, secs float64) float64 {
	var d float64
	for pid, v := range b {
		if u, ok := a[pid]; ok {
			d += v - u
		}
	}
	return d / secs
}

// leader returns the index of the member that leads.
func (cl *cluster) leader(cli *clientv3.Client) int {
	for i, ep := range cl.eps {
		if cl.procs[i] == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// workerProc is one worker process.
type workerProc struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *json.Decoder
	pin interface{ Close() error }
}

func startWorker(eps []string, from, to int, proxied float64, dir string) (*workerProc, error) {
	cmd := exec.Command(os.Args[0], append([]string{"-role", "worker", "-from", strconv.Itoa(from), "-to", strconv.Itoa(to),
		"-proxied-share", strconv.FormatFloat(proxied, 'f', -1, 64), "-dir", dir, "--"}, eps...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &workerProc{cmd: cmd, in: bufio.NewWriter(in), out: json.NewDecoder(out), pin: in}, nil
}

func (w *workerProc) send(cmd string) error {
	if cmd != "" {
		if _, err := w.in.WriteString(cmd + "\n"); err != nil {
			return err
		}
		if err := w.in.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func (w *workerProc) recv(v any) error { return w.out.Decode(v) }

// all sends cmd to every worker and decodes each one's answer.
func all[T any](ws []*workerProc, cmd string) ([]T, error) {
	for _, w := range ws {
		if err := w.send(cmd); err != nil {
			return nil, err
		}
	}
	out := make([]T, len(ws))
	for i, w := range ws {
		if err := w.recv(&out[i]); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	return out, nil
}

type statsReply struct {
	Hosts      int              `json:"hosts"`
	RPCs       map[string]int64 `json:"rpcs"`
	Heap       float64          `json:"heap"`
	RSS        float64          `json:"rss"`
	Relists    int              `json:"relists"`
	Periodic   int              `json:"periodic_relists"`
	RelistsMax int              `json:"relists_max"`
	Warnings   int64            `json:"warnings"`
	Refusals   int64            `json:"refusals"`
	Kinds      map[string]int   `json:"warning_kinds"`
}

type seenReply struct {
	Seen    []int64 `json:"seen"`
	Missing int     `json:"missing"`
}

type sum struct {
	rpcs                map[string]int64
	heap, rss           float64
	relists, relistsMax int
	periodic            int
	refusals            int64
	kinds               map[string]int
}

func stats(ws []*workerProc) (sum, error) {
	rs, err := all[statsReply](ws, "stats")
	s := sum{rpcs: map[string]int64{}, kinds: map[string]int{}}
	for _, r := range rs {
		for k, v := range r.RPCs {
			s.rpcs[k] += v
		}
		s.heap += r.Heap
		s.rss += r.RSS
		s.relists += r.Relists
		s.periodic += r.Periodic
		s.relistsMax = max(s.relistsMax, r.RelistsMax)
		s.refusals += r.Refusals
		for k, v := range r.Kinds {
			s.kinds[k] += v
		}
	}
	return s, err
}

func (c *coordinator) measure(n int) error {
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
	reg := etcdv3.NewRegistry(admin, prefix)
	ctx := context.Background()
	if _, err := reg.PutConfig(ctx, []byte(`{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`)); err != nil {
		return err
	}
	// Proxies only where a scenario cuts them: they copy every byte.
	proxied := 0.0
	if strings.Contains(c.cfg.Scenarios, "partition") || strings.Contains(c.cfg.Scenarios, "compact") {
		proxied = c.cfg.Proxied
	}
	t0 := time.Now()
	var ws []*workerProc
	defer func() {
		for _, w := range ws {
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
	}()
	for from := 0; from < n; from += c.cfg.Per {
		w, err := startWorker(cl.eps, from, min(n, from+c.cfg.Per), proxied, cl.dir)
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	started, err := all[map[string]any](ws, "")
	if err != nil {
		return err
	}
	fmt.Printf("   per host (connect, config, node ID, acquire), s: %v\n", started[0]["step_secs"])
	fmt.Printf("== N=%d: all hosts hold leases after %s\n", n, time.Since(t0).Round(time.Second))
	c.add(n, "start all hosts", "s", []float64{time.Since(t0).Seconds()}, "")

	// Steady state.
	time.Sleep(5 * time.Second)
	s0, err := stats(ws)
	if err != nil {
		return err
	}
	cpu0, _ := cl.usage()
	time.Sleep(c.cfg.Steady)
	s1, err := stats(ws)
	if err != nil {
		return err
	}
	cpu1, rss := cl.usage()
	secs := c.cfg.Steady.Seconds()
	var total float64
	var detail []string
	for k, v := range s1.rpcs {
		d := float64(v-s0.rpcs[k]) / secs / float64(n)
		total += d
		if d > 0 {
			detail = append(detail, fmt.Sprintf("%s=%.3f", k[strings.LastIndexByte(k, '/')+1:], d))
		}
	}
	slices.Sort(detail)
	c.add(n, "steady rpcs per host", "1/s", []float64{total}, strings.Join(detail, " "))
	c.add(n, "steady etcd cpu (3 members)", "cores", []float64{cpuSince(cpu0, cpu1, secs)}, "")
	c.add(n, "steady etcd rss per member", "MB", mb(rss), "")
	c.add(n, "sim heap per host", "KB", []float64{s1.heap / float64(n) / 1024}, "")
	c.add(n, "sim rss per host", "KB", []float64{s1.rss / float64(n) / 1024}, "")

	// Joins.
	var p50, p99, pmax []float64
	for r := range c.cfg.Runs {
		lat, missing, err := c.join(reg, ws, 10000+r)
		if err != nil {
			return err
		}
		if missing > 0 {
			fmt.Printf("   join %d: %d hosts did not see it within 30 s\n", r, missing)
		}
		p50, p99, pmax = append(p50, pct(lat, 0.5)), append(p99, pct(lat, 0.99)), append(pmax, pct(lat, 1))
	}
	c.add(n, "join seen by all: p50", "ms", p50, "")
	c.add(n, "join seen by all: p99", "ms", p99, "")
	c.add(n, "join seen by all: max", "ms", pmax, "")

	probe := 20000
	for _, sc := range strings.Split(c.cfg.Scenarios, ",") {
		before, err := stats(ws)
		if err != nil {
			return err
		}
		cpuA, _ := cl.usage()
		tA := time.Now()
		from := tA // when the hosts may begin to catch up
		switch sc {
		case "churn":
			// 1 % of hosts restart within a minute.
			if _, err := all[map[string]any](ws, "restart 0.01 60"); err != nil {
				return err
			}
		case "restart":
			rs, err := all[map[string]any](ws, "restart 1 10")
			if err != nil {
				return err
			}
			fmt.Printf("   restart: %v\n", rs)
		case "leader":
			l := cl.leader(admin)
			if l < 0 {
				return errors.New("no leader found")
			}
			cl.stop(l)
		case "partition", "compact":
			// The proxied hosts are cut off; a host joins meanwhile (its
			// lease stays). compact: after 20 s, etcd compacts past every
			// revision the cut-off hosts have seen, so none can resume.
			if proxied == 0 {
				continue
			}
			probe++
			if err := c.isolated(ws, reg, admin, probe, sc == "compact"); err != nil {
				return err
			}
			from = time.Now()
		default:
			return fmt.Errorf("unknown scenario %q", sc)
		}
		// Current again: a join written now is seen by every host. While
		// some host misses one (within 30 s), another is written, for up
		// to 5 minutes after the scenario.
		var lat []float64
		missing := 0
		for {
			probe++
			lat, missing, err = c.join(reg, ws, probe)
			if err != nil {
				return err
			}
			if missing == 0 || time.Since(from) > 5*time.Minute {
				break
			}
			fmt.Printf("   %s: %d hosts not current after %s\n", sc, missing, time.Since(from).Round(time.Second))
		}
		current := time.Since(from).Seconds() - (time.Since(c.lastWrite).Seconds() - pct(lat, 1)/1000)
		cpuB, rssB := cl.usage()
		for i := range cl.procs {
			if cl.procs[i] == nil {
				if err := cl.start(i, "existing"); err != nil {
					return err
				}
			}
		}
		after, err := stats(ws)
		if err != nil {
			return err
		}
		el := time.Since(tA).Seconds()
		printWarnings(sc, before.kinds, after.kinds)
		note := fmt.Sprintf("missing=%d relists=%d max_per_host=%d periodic_relists=%d refusals=%d", missing, after.relists-before.relists,
			after.relistsMax, after.periodic-before.periodic, after.refusals-before.refusals)
		c.add(n, sc+": all current after", "s", []float64{current}, note)
		c.add(n, sc+": etcd cpu (3 members)", "cores", []float64{cpuSince(cpuA, cpuB, el)}, "")
		c.add(n, sc+": etcd rss per member", "MB", mb(rssB), "")
	}
	return nil
}

// writeProbe writes the lease of a joining host, the k-th probe (or a
// later one where a simulated host holds that subnet), retrying until etcd
// commits it, and returns its subnet and when the write that succeeded began.
func (c *coordinator) writeProbe(reg *etcdv3.Registry, k int) (netip.Prefix, time.Time, error) {
	attrs := subnet.NewVXLANAttrs(netip.MustParseAddr("192.0.2.1"), 1, net.HardwareAddr{2, 0, 0, 0, 0, 1}, fmt.Sprintf("probe-%d", k), "probe")
	// Bounded: a cluster that does not commit within a minute is a result.
	for give := time.Now().Add(time.Minute); time.Now().Before(give); {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + k/10000), byte(k % 256), 0}), 24)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		c.lastWrite = t0
		_, err := reg.Create(ctx, subnet.Subnets{IPv4: p}, attrs, 0)
		cancel()
		switch {
		case err == nil:
			return p, t0, nil
		case errors.Is(err, etcdv3.ErrTaken):
			k += 256 // a host picked it at random: take the next one
		default:
			time.Sleep(500 * time.Millisecond)
		}
	}
	return netip.Prefix{}, time.Time{}, errors.New("write a joining host's lease: etcd did not commit it within a minute")
}

// isolated cuts the proxied hosts off, writes the lease of a joining host
// (seen only by the others), compacts etcd's history to the present when
// compact is set, and heals.
func (c *coordinator) isolated(ws []*workerProc, reg *etcdv3.Registry, admin *clientv3.Client, k int, compact bool) error {
	if _, err := all[map[string]any](ws, "partition"); err != nil {
		return err
	}
	hold := c.cfg.Partition
	if compact {
		hold = 20 * time.Second
	}
	end := time.Now().Add(hold)
	if _, _, err := c.writeProbe(reg, k); err != nil {
		return fmt.Errorf("a join during the partition: %w", err)
	}
	time.Sleep(time.Until(end))
	if compact {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := admin.Get(ctx, "compaction-probe")
		if err != nil {
			return err
		}
		if _, err := admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			return fmt.Errorf("compact: %w", err)
		}
	}
	_, err := all[map[string]any](ws, "heal")
	return err
}

// printWarnings lists the kinds of warning the hosts logged between two
// stats, most frequent first.
func printWarnings(what string, before, after map[string]int) {
	type kind struct {
		text string
		n    int
	}
	var ks []kind
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			ks = append(ks, kind{k, d})
		}
	}
	slices.SortFunc(ks, func(a, b kind) int { return b.n - a.n })
	for _, k := range ks[:min(len(ks), 8)] {
		fmt.Printf("   %s: %6d × %s\n", what, k.n, k.text)
	}
}

func mb(bs []int64) []float64 {
	var out []float64
	for _, b := range bs {
		out = append(out, float64(b)/1e6)
	}
	return out
}

// join writes a new host's lease and returns how long after the write each
// host saw it (ms) and how many hosts did not within 30 s.
func (c *coordinator) join(reg *etcdv3.Registry, ws []*workerProc, k int) ([]float64, int, error) {
	p, t0, err := c.writeProbe(reg, k)
	if err != nil {
		return nil, 0, err
	}
	rs, err := all[seenReply](ws, "seen "+p.String()+" 30")
	var lat []float64
	missing := 0
	for _, r := range rs {
		missing += r.Missing
		for _, t := range r.Seen {
			lat = append(lat, float64(t-t0.UnixNano())/1e6)
		}
	}
	// The probe is removed again so the next one starts from the same set.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = reg.Delete(ctx, subnet.Subnets{IPv4: p})
	return lat, missing, err
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

func (c *coordinator) write() error {
	if c.cfg.Out == "" {
		return nil
	}
	host, _ := os.Hostname()
	path := filepath.Join(c.cfg.Out, time.Now().UTC().Format("2006-01-02")+"-"+host+"-scale.jsonl")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range c.results {
		line := struct {
			result
			Time string `json:"time"`
			CPUs int    `json:"cpus"`
		}{r, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU()}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	fmt.Printf("results appended to %s\n", path)
	return nil
}
