// Command overlay-demo is `make demo`: it starts a 3-host overlay cluster
// in network namespaces (internal/lab: an underlay bridge, an embedded etcd
// on a unix socket, one real overlayd per host, two pods per host attached
// through overlay-cni), shows what it built — leases, routes, pod-to-pod
// pings — and removes it all again, also on Ctrl-C. With -dual-stack the
// network carries IPv6 too (`make demo DUALSTACK=1`): every host leases an
// IPv4 and an IPv6 subnet, pods get both addresses, and the demo shows the
// IPv6 routes and pings as well.
//
//	overlay-demo [-bin DIR] [-dual-stack]   run the demo, print, tear down
//	KEEP=1 overlay-demo                      keep the lab running in the background
//	overlay-demo down                        stop a kept lab (`make demo-down`)
//
// It builds nothing: `make demo` builds the binaries first. It needs root
// for the namespaces, and touches nothing outside them.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

const (
	hosts       = 3
	podsPerHost = 2
	// keepChild is the hidden argument of the detached process KEEP=1 starts.
	keepChild = "__keep-child"
	// ready ends the report a detached demo sends to its parent.
	ready = "\x00overlay-demo-ready"
	// dualStackNetwork is the network config of -dual-stack: the plain
	// demo's IPv4 network (lab.DefaultNetworkConfig) and an IPv6 one.
	dualStackNetwork = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`
)

// options are the demo's flags, passed on to a kept demo's child.
type options struct {
	bin       string // -bin as given (for the hints printed)
	dualStack bool
}

// args are the flags that give o again.
func (o options) args() []string {
	args := []string{"-bin", o.bin}
	if o.dualStack {
		args = append(args, "-dual-stack")
	}
	return args
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "down" {
		os.Exit(down(os.Stdout))
	}
	child := len(os.Args) > 1 && os.Args[1] == keepChild
	args := os.Args[1:]
	if child {
		args = args[1:]
	}
	fs := flag.NewFlagSet("overlay-demo", flag.ExitOnError)
	var o options
	fs.StringVar(&o.bin, "bin", "bin", "directory with overlayd, overlay-cni and cni/ (make build plugins)")
	fs.BoolVar(&o.dualStack, "dual-stack", false, "a dual-stack network: IPv4 and IPv6 subnets, pods with both addresses")
	_ = fs.Parse(args)
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "overlay-demo needs root to create network namespaces: sudo make demo")
		os.Exit(1)
	}
	binDir, err := filepath.Abs(o.bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch {
	case child:
		os.Exit(runKept(binDir, o))
	case os.Getenv("KEEP") != "" && os.Getenv("KEEP") != "0":
		os.Exit(startKept(o))
	default:
		os.Exit(runOnce(binDir, o))
	}
}

// runOnce is the plain demo: build, show, tear down.
func runOnce(binDir string, o options) int {
	// Ctrl-C (or SIGTERM) cancels ctx; the signals stay caught until the
	// end so a second Ctrl-C cannot interrupt the cleanup.
	ctx, cancel := signalContext()
	defer cancel()
	out := os.Stdout
	l, err := build(ctx, out, binDir, "", o.dualStack)
	if l != nil {
		defer teardown(out, l)
	}
	if err == nil {
		err = report(ctx, out, l, o, false)
	}
	if err != nil {
		code := fail(ctx, out, err)
		if l != nil && code != 130 {
			fmt.Fprintf(out, "\nThe end of each log:\n%s", l.LogTails(15))
		}
		return code
	}
	return 0
}

func fail(ctx context.Context, w io.Writer, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintln(w, "\ninterrupted")
		return 130
	}
	fmt.Fprintf(w, "\ndemo failed: %v\n", err)
	return 1
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for range sig {
			cancel()
		}
	}()
	return ctx, cancel
}

// build starts the lab: etcd, hosts with overlayd, pods.
func build(ctx context.Context, w io.Writer, binDir, dir string, dualStack bool) (*lab.Lab, error) {
	cfg := lab.Config{
		Root:     filepath.Dir(binDir), // for deploy/cni/10-overlay.conflist
		BinDir:   binDir,
		Dir:      dir,
		LogLevel: "info",
	}
	stack := ""
	if dualStack {
		cfg.NetworkConfig, stack = dualStackNetwork, ", dual stack (IPv4 and IPv6)"
	}
	fmt.Fprintf(w, "overlay demo: %d simulated hosts in network namespaces, %d pods each%s\n\n", hosts, podsPerHost, stack)
	start := time.Now()
	l, err := lab.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "  etcd      embedded in this process, on %s\n", l.Endpoint())
	if dualStack {
		fmt.Fprintf(w, "  network   %s\n", dualStackNetwork)
		fmt.Fprintf(w, "  underlay  bridge \"ul\" in namespace %sul, 198.18.0.0/24 and %s\n", l.Run(), lab.UnderlayIPv6)
	} else {
		fmt.Fprintf(w, "  underlay  bridge \"ul\" in namespace %sul, 198.18.0.0/24\n", l.Run())
	}
	var nodes []*lab.Node
	for i := 1; i <= hosts; i++ {
		n, err := l.AddNode("h"+strconv.Itoa(i), i)
		if err != nil {
			return l, err
		}
		if err := n.Start(); err != nil {
			return l, err
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := n.WaitReady(rctx)
		cancel()
		if err != nil {
			return l, fmt.Errorf("%w (log: %s)", err, n.LogFile)
		}
	}
	for _, n := range nodes {
		for j := 1; j <= podsPerHost; j++ {
			if _, err := n.AddPod(ctx, "p"+strconv.Itoa(j)); err != nil {
				return l, err
			}
		}
	}
	for _, n := range nodes {
		sub, err := n.Lease()
		if err != nil {
			return l, err
		}
		if !dualStack {
			fmt.Fprintf(w, "  %-8s  namespace %s, eth0 %s, overlayd pid %d, subnet %s\n", n.Name, n.NSName, n.IP, n.PID(), sub)
			for _, p := range n.Pods() {
				fmt.Fprintf(w, "              pod %s %s (namespace %s)\n", p.Name, p.IP, p.NSName)
			}
			continue
		}
		sub6, err := n.IPv6Lease()
		if err != nil {
			return l, err
		}
		fmt.Fprintf(w, "  %-8s  namespace %s, eth0 %s and %s, overlayd pid %d, subnets %s and %s\n", n.Name, n.NSName, n.IP, n.IPv6, n.PID(), sub, sub6)
		for _, p := range n.Pods() {
			fmt.Fprintf(w, "              pod %s %s and %s (namespace %s)\n", p.Name, p.IP, p.IPv6, p.NSName)
		}
	}
	fmt.Fprintf(w, "\n  ready in %s\n", time.Since(start).Round(time.Millisecond))
	return l, nil
}

// report prints the leases, routes, pings and how to explore (over IPv4,
// and over IPv6 too in a dual-stack demo). It is long (over 80 lines) as
// the page it prints is: one section after another, top to bottom.
func report(ctx context.Context, w io.Writer, l *lab.Lab, o options, kept bool) error {
	section(w, "Leases in etcd", "bin/overlayd lease list")
	table, err := l.CLI(ctx, "lease", "list")
	if err != nil {
		return err
	}
	fmt.Fprint(w, indent(table, "  "))

	families := []family{ipv4}
	if o.dualStack {
		families = append(families, ipv6)
	}
	for _, f := range families {
		if err := showRoutes(w, l, f); err != nil {
			return err
		}
	}
	pods := l.Pods()
	for _, f := range families {
		if err := showPings(w, pods, f); err != nil {
			return err
		}
	}

	if kept {
		section(w, "Explore", "the cluster keeps running until make demo-down")
	} else {
		section(w, "Explore", "run KEEP=1 make demo to keep the cluster up for these")
	}
	n1 := l.Nodes()[0]
	var remote *lab.Pod
	for _, p := range pods {
		if p.Node != n1 {
			remote = p
			break
		}
	}
	overlayd := filepath.Join(o.bin, "overlayd")
	hints := [][2]string{
		{"The namespaces (ul: the underlay switch; h1..h3: hosts; h1-p1...: pods):", "ip netns list | grep " + l.Run()},
		{n1.Name + "'s routing table, and where its VXLAN device sends each VTEP MAC:", "ip netns exec " + n1.NSName + " ip route"},
		{"", "ip netns exec " + n1.NSName + " bridge fdb show dev overlay.1"},
	}
	if o.dualStack {
		hints = append(hints,
			[2]string{"The same for IPv6, on the second VXLAN device:", "ip netns exec " + n1.NSName + " ip -6 route show proto 115"},
			[2]string{"", "ip netns exec " + n1.NSName + " bridge fdb show dev overlay-v6.1"})
	}
	if _, err := exec.LookPath("ping"); err == nil {
		hints = append(hints, [2]string{"A pod on " + n1.Name + " pings a pod on " + remote.Node.Name + ":", "ip netns exec " + n1.NSName + "-p1 ping -c 3 " + remote.IP.String()})
		if o.dualStack {
			hints = append(hints, [2]string{"", "ip netns exec " + n1.NSName + "-p1 ping -c 3 " + remote.IPv6.String()})
		}
	}
	if _, err := exec.LookPath("curl"); err == nil {
		hints = append(hints, [2]string{fmt.Sprintf("Every pod answers on TCP %d with the address it sees you come from (no NAT):", lab.ProbePort),
			fmt.Sprintf("ip netns exec %s-p1 curl -s telnet://%s:%d </dev/null", n1.NSName, remote.IP, lab.ProbePort)})
		if o.dualStack {
			hints = append(hints, [2]string{"", fmt.Sprintf("ip netns exec %s-p1 curl -s telnet://[%s]:%d </dev/null", n1.NSName, remote.IPv6, lab.ProbePort)})
		}
	}
	hints = append(hints,
		[2]string{"The leases in etcd (try also: lease get, config get):", overlayd + " --endpoints " + l.Endpoint() + " lease list"})
	if _, err := exec.LookPath("curl"); err == nil {
		hints = append(hints, [2]string{n1.Name + "'s overlayd: its state as JSON (also /readyz, /metrics), and as a table:", "ip netns exec " + n1.NSName + " curl -s " + lab.HealthAddr + "/status"})
	} else {
		hints = append(hints, [2]string{n1.Name + "'s overlayd: its state as a table:", ""})
	}
	hints = append(hints,
		[2]string{"", "ip netns exec " + n1.NSName + " " + overlayd + " status"},
		[2]string{n1.Name + "'s overlayd log:", "less " + n1.LogFile})
	for _, h := range hints {
		if h[0] != "" {
			fmt.Fprintf(w, "  %s\n", h[0])
		}
		if h[1] != "" {
			fmt.Fprintf(w, "      %s\n", h[1])
		}
	}
	return nil
}

// family is what the report shows of one address family.
type family struct {
	name   string // "" for IPv4 (the plain demo's titles), "IPv6"
	routes func(*lab.Node) ([]lab.Route, error)
	device string                    // the VXLAN device
	addr   func(*lab.Pod) netip.Addr // a pod's address
}

var (
	ipv4 = family{routes: (*lab.Node).Routes, device: "overlay.1", addr: func(p *lab.Pod) netip.Addr { return p.IP }}
	ipv6 = family{name: "IPv6", routes: (*lab.Node).IPv6Routes, device: "overlay-v6.1", addr: func(p *lab.Pod) netip.Addr { return p.IPv6 }}
)

// pod names p with its address of family f.
func (f family) pod(p *lab.Pod) string {
	if f.name == "" {
		return p.String()
	}
	return fmt.Sprintf("%s/%s (%s)", p.Node.Name, p.Name, p.IPv6)
}

// title is a section title, with the family named for IPv6.
func (f family) title(s string) string {
	if f.name == "" {
		return s
	}
	return s + " (" + f.name + ")"
}

// showRoutes prints every host's overlay routes of family f.
func showRoutes(w io.Writer, l *lab.Lab, f family) error {
	if f.name == "" {
		section(w, "Overlay routes on each host", "ip route show proto 115")
		fmt.Fprintln(w, "  One route per other host's subnet: via that host's VTEP address, onlink, out of the VXLAN")
		fmt.Fprintln(w, "  device overlay.1; a static neighbour and FDB entry (not shown) send it to the host's 198.18.0.x.")
	} else {
		section(w, f.title("Overlay routes on each host"), "ip -6 route show proto 115")
		fmt.Fprintln(w, "  The same for each other host's IPv6 subnet, out of the second VXLAN device "+f.device+", whose")
		fmt.Fprintln(w, "  static neighbour and FDB entries send it to the host's IPv6 underlay address fd18::x.")
	}
	for _, n := range l.Nodes() {
		rs, err := f.routes(n)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %s (%s):\n", n.Name, n.NSName)
		for _, r := range rs {
			fmt.Fprintf(w, "    %s\n", r)
		}
	}
	return nil
}

// showPings prints the matrix of pod-to-pod pings over family f, then
// checks that every pod pair connects over TCP without NAT.
func showPings(w io.Writer, pods []*lab.Pod, f family) error {
	section(w, f.title("Pod-to-pod pings"), "ICMP echo from each pod's namespace: median round-trip time of 3")
	label := func(p *lab.Pod) string { return p.Node.Name + "/" + p.Name + " " + f.addr(p).String() }
	width := len("from \\ to")
	for _, p := range pods {
		width = max(width, len(label(p)))
	}
	fmt.Fprintf(w, "  %-*s", width, "from \\ to")
	for _, p := range pods {
		fmt.Fprintf(w, "%10s", p.Node.Name+"/"+p.Name)
	}
	fmt.Fprintln(w)
	var failed []string
	for _, from := range pods {
		fmt.Fprintf(w, "  %-*s", width, label(from))
		for _, to := range pods {
			if from == to {
				fmt.Fprintf(w, "%10s", "-")
				continue
			}
			rtt, err := medianPing(from, f.addr(to))
			if err != nil {
				fmt.Fprintf(w, "%10s", "LOST")
				failed = append(failed, fmt.Sprintf("%s -> %s: %v", f.pod(from), f.pod(to), err))
				continue
			}
			fmt.Fprintf(w, "%7.3f ms", float64(rtt.Microseconds())/1000)
		}
		fmt.Fprintln(w)
	}
	if len(failed) > 0 {
		return fmt.Errorf("pings failed:\n  %s", strings.Join(failed, "\n  "))
	}
	if f.name == "" {
		fmt.Fprintf(w, "  Pods on different hosts talk through the VXLAN tunnel (UDP 8472 between the hosts' eth0);\n")
		fmt.Fprintf(w, "  pods on the same host through the host's bridge cni0.\n")
	} else {
		fmt.Fprintf(w, "  Over IPv6, pods on different hosts talk through %s (UDP 8472 between the hosts' IPv6\n", f.device)
		fmt.Fprintf(w, "  underlay addresses); pods on the same host through the host's bridge cni0.\n")
	}
	// And over TCP: the destination sees the caller's own address.
	pairs := 0
	for _, from := range pods {
		for _, to := range pods {
			if from == to {
				continue
			}
			seen, err := lab.WhoAmI(from.NS, netip.AddrPortFrom(f.addr(to), lab.ProbePort), 2*time.Second)
			if err != nil {
				return fmt.Errorf("TCP %s -> %s: %w", f.pod(from), f.pod(to), err)
			}
			if seen != f.addr(from) {
				return fmt.Errorf("TCP %s -> %s: seen from %s (NAT?)", f.pod(from), f.pod(to), seen)
			}
			pairs++
		}
	}
	if f.name == "" {
		fmt.Fprintf(w, "  TCP: all %d pod pairs connect, and every destination sees the caller's own pod address (no NAT).\n", pairs)
	} else {
		fmt.Fprintf(w, "  TCP over %s: all %d pod pairs connect, and every destination sees the caller's own pod address (no NAT).\n", f.name, pairs)
	}
	return nil
}

// medianPing pings dst from pod from three times and returns the median
// RTT.
func medianPing(from *lab.Pod, dst netip.Addr) (time.Duration, error) {
	var rtts []time.Duration
	for range 3 {
		rtt, err := lab.Ping(from.NS, dst, 2*time.Second)
		if err != nil {
			return 0, err
		}
		rtts = append(rtts, rtt)
	}
	slices.Sort(rtts)
	return rtts[1], nil
}

func section(w io.Writer, title, note string) {
	if note != "" {
		fmt.Fprintf(w, "\n== %s  (%s)\n", title, note)
	} else {
		fmt.Fprintf(w, "\n== %s\n", title)
	}
}

func indent(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(prefix + line)
	}
	return b.String()
}

// teardown removes the lab and says so.
func teardown(w io.Writer, l *lab.Lab) {
	fmt.Fprintf(w, "\nTearing down: pods (CNI DEL), overlayd (SIGTERM), etcd, namespaces %s* ...", l.Run())
	start := time.Now()
	if err := l.Close(); err != nil {
		fmt.Fprintf(w, " failed: %v\n", err)
		return
	}
	fmt.Fprintf(w, " done in %s; nothing left behind.\n", time.Since(start).Round(time.Millisecond))
}

// --- KEEP=1: a detached demo, stopped by `overlay-demo down`.

// stateDir holds a kept demo's pid file, its log and the lab's work
// directory (so the etcd socket has a short, fixed path).
func stateDir() string {
	if fi, err := os.Stat("/run"); err == nil && fi.IsDir() {
		return "/run/overlay-demo"
	}
	return filepath.Join(os.TempDir(), "overlay-demo")
}

func pidFile() string { return filepath.Join(stateDir(), "demo.pid") }
func logFile() string { return filepath.Join(stateDir(), "demo.log") }

// keptPID returns the PID of a running kept demo, or 0.
func keptPID() int {
	data, err := os.ReadFile(pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || !isKeptDemo(pid) {
		return 0
	}
	return pid
}

// isKeptDemo reports whether pid is a live overlay-demo started by
// startKept (and not some process that got a recycled PID).
func isKeptDemo(pid int) bool {
	if !lab.ProcessAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(string(cmdline), "\x00")
	return len(args) > 1 && filepath.Base(args[0]) == "overlay-demo" && args[1] == keepChild
}

// startKept starts the demo detached (its own session, output to the log
// after the report), relays its report and returns once it is up.
func startKept(o options) int {
	if pid := keptPID(); pid != 0 {
		fmt.Fprintf(os.Stderr, "a demo is already running (pid %d): stop it first with make demo-down\n", pid)
		return 1
	}
	if err := os.RemoveAll(stateDir()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.MkdirAll(stateDir(), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logf, err := os.OpenFile(logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logf.Close()
	r, wr, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(self, append([]string{keepChild}, o.args()...)...)
	cmd.Dir, _ = os.Getwd()
	cmd.Stdout, cmd.Stderr = wr, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // no terminal, no Ctrl-C
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	wr.Close()
	ok := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() == ready {
			ok = true
			break
		}
		fmt.Println(sc.Text())
	}
	if !ok {
		err := cmd.Wait()
		fmt.Fprintf(os.Stderr, "the demo did not start (%v); its log, %s:\n", err, logFile())
		if data, rerr := os.ReadFile(logFile()); rerr == nil {
			os.Stderr.Write(data)
		}
		return 1
	}
	// The child runs on; it is not ours to wait for.
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	fmt.Printf("\nThe cluster keeps running in the background (pid %d, log %s).\nStop it with: make demo-down\n", pid, logFile())
	return 0
}

// runKept is the detached demo: build, report to the parent through
// stdout, then run until SIGTERM and clean up.
func runKept(binDir string, o options) int {
	ctx, cancel := signalContext()
	defer cancel()
	logw := os.Stderr
	fmt.Fprintf(logw, "%s overlay-demo (pid %d) starting\n", time.Now().Format(time.RFC3339), os.Getpid())
	if err := os.WriteFile(pidFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stdout, err)
		return 1
	}
	defer os.RemoveAll(stateDir())
	l, err := build(ctx, os.Stdout, binDir, filepath.Join(stateDir(), "lab"), o.dualStack)
	if l != nil {
		defer teardown(logw, l)
	}
	if err == nil {
		err = report(ctx, os.Stdout, l, o, true)
	}
	if err != nil {
		fail(ctx, os.Stdout, err)
		fmt.Fprintf(logw, "demo failed: %v\n", err)
		return 1
	}
	fmt.Fprintln(os.Stdout, ready)
	// The parent stops reading now: point stdout at the log, so that no
	// later write meets a closed pipe.
	if err := unix.Dup2(int(logw.Fd()), 1); err != nil {
		fmt.Fprintf(logw, "redirect stdout: %v\n", err)
	}
	fmt.Fprintf(logw, "%s up; waiting for SIGTERM (make demo-down)\n", time.Now().Format(time.RFC3339))
	<-ctx.Done()
	fmt.Fprintf(logw, "%s stopping\n", time.Now().Format(time.RFC3339))
	return 0
}

// down stops a kept demo: SIGTERM to the recorded PID (after checking it
// is the demo), wait for it to clean up, then remove the namespaces of any
// dead lab run.
func down(w io.Writer) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "overlay-demo down needs root: sudo make demo-down")
		return 1
	}
	code := 0
	if pid := keptPID(); pid == 0 {
		fmt.Fprintln(w, "no demo is running")
	} else {
		fmt.Fprintf(w, "stopping the demo (pid %d) ...", pid)
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			fmt.Fprintf(w, " %v\n", err)
			return 1
		}
		deadline := time.Now().Add(60 * time.Second)
		for lab.ProcessAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if lab.ProcessAlive(pid) {
			fmt.Fprintf(w, " still running after 60s; killing it\n")
			_ = syscall.Kill(pid, syscall.SIGKILL)
			code = 1
		} else {
			fmt.Fprintln(w, " stopped")
		}
	}
	// Whatever a dead run left (a demo that was killed, a crashed test).
	if err := lab.RemoveStale(); err != nil {
		fmt.Fprintf(w, "removing stale namespaces: %v\n", err)
		code = 1
	}
	if keptPID() == 0 {
		_ = os.RemoveAll(stateDir())
	}
	if left := lab.StaleNamespaces(); len(left) > 0 {
		fmt.Fprintf(w, "namespaces of dead lab runs still there: %s\n", strings.Join(left, " "))
		code = 1
	} else {
		fmt.Fprintln(w, "no lab namespaces of dead runs are left")
	}
	return code
}
