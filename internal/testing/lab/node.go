package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// HealthAddr is where overlayd serves /readyz and /status on each host. The
// default is fine: every host namespace has its own loopback.
const HealthAddr = subnet.DefaultHealthAddr

// Node is a simulated host running a real `overlayd run` process in its
// namespace. Its files live in Dir: subnet.env, overlayd.log (appended to
// across restarts), overlay-cni's cache and host-local's reservations.
type Node struct {
	*Host
	Dir        string
	SubnetFile string
	LogFile    string
	// ExtraArgs are appended to this host's `overlayd run` (after the lab's).
	ExtraArgs []string
	// Overlayd, if set, is the overlayd binary this host runs instead of
	// the lab's (a benchmark comparing two builds in one lab).
	Overlayd string
	// NetworkName, if set, replaces the conflist's network name in this
	// host's pods' CNI config (a host taken over from flannel keeps
	// flannel's, so host-local's store stays the same), and
	// FlannelDataDir, if set, is overlay-cni's flannelDataDir: where
	// flannel's plugin cached the pods it added.
	NetworkName    string
	FlannelDataDir string

	lab    *Lab
	http   *http.Client
	mu     sync.Mutex
	proc   *process
	pods   []*Pod
	closed bool
}

// process is one overlayd process the lab started.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited and been reaped
	err  error         // cmd.Wait's result, set before done closes
}

// AddNode creates host name with eth0 = 198.18.0.<n>/24 on the underlay.
// overlayd is not started: call Start.
func (l *Lab) AddNode(name string, n int) (*Node, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("lab is closed")
	}
	for _, x := range l.nodes {
		if x.Name == name {
			return nil, fmt.Errorf("host %s exists", name)
		}
	}
	dir := filepath.Join(l.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	h, err := l.Underlay.AddHost(name, n)
	if err != nil {
		return nil, err
	}
	node := &Node{Host: h, Dir: dir, SubnetFile: filepath.Join(dir, "subnet.env"), LogFile: filepath.Join(dir, "overlayd.log"), lab: l}
	node.http = &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true, // a restarted overlayd must not meet a dead connection
			DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
				err = Do(h.NS, func() error {
					conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return conn, err
			},
		},
	}
	l.nodes = append(l.nodes, node)
	return node, nil
}

// RemoveNode stops n's overlayd (SIGTERM), deletes its pods and its
// namespace. Its lease stays in etcd: use Teardown first to release it.
func (l *Lab) RemoveNode(n *Node) error {
	l.mu.Lock()
	l.nodes = slices.DeleteFunc(l.nodes, func(x *Node) bool { return x == n })
	l.mu.Unlock()
	err := n.close()
	return errors.Join(err, l.Underlay.RemoveHost(n.Host))
}

// close deletes the pods and stops overlayd (the namespace stays).
func (n *Node) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, p := range n.Pods() {
		errs = append(errs, p.Delete(ctx))
	}
	errs = append(errs, n.Stop(syscall.SIGTERM))
	return errors.Join(errs...)
}

// RunArgs returns the arguments of this host's `overlayd run`.
func (n *Node) RunArgs() []string {
	args := []string{
		"--endpoints=" + n.lab.Endpoint(),
		"run",
		"--iface=" + n.Iface,
		"--public-ip=" + n.IP.String(),
		"--node-name=" + n.Name,
		"--subnet-file=" + n.SubnetFile,
		"--kernel-resync=" + n.lab.cfg.KernelResync.String(),
		"--health-addr=" + HealthAddr,
		"--log-level=" + n.lab.cfg.LogLevel,
	}
	return append(append(args, n.lab.cfg.RunArgs...), n.ExtraArgs...)
}

// hostArgs are the flags that identify this host to `overlayd teardown`.
func (n *Node) hostArgs() []string {
	return []string{"--iface=" + n.Iface, "--public-ip=" + n.IP.String(), "--node-name=" + n.Name, "--subnet-file=" + n.SubnetFile}
}

// Start starts `overlayd run` in the host's namespace, logging to LogFile.
// It does not wait for readiness (WaitReady does).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("%s is closed", n.Name)
	}
	if n.proc != nil && !n.proc.exited() {
		return fmt.Errorf("overlayd on %s already runs (pid %d)", n.Name, n.proc.cmd.Process.Pid)
	}
	log, err := os.OpenFile(n.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file for %s: %w", n.Name, err)
	}
	defer log.Close() // the child holds its own descriptor
	args := n.RunArgs()
	bin := n.lab.Binary("overlayd")
	if n.Overlayd != "" {
		bin = n.Overlayd
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = testenv.ProgramEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a Ctrl-C on the terminal reaches the lab,
		// which stops its daemons in order.
		Setpgid: true,
		// Never outlive the lab's process (a test binary killed by its
		// timeout, a demo killed with SIGKILL).
		Pdeathsig: syscall.SIGKILL,
	}
	fmt.Fprintf(log, "==== lab %s: starting overlayd %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	// A process forked from a thread in the host's namespace is born there.
	if err := Do(n.NS, cmd.Start); err != nil {
		return fmt.Errorf("start overlayd on %s: %w", n.Name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.proc = p
	fmt.Fprintf(log, "==== lab: overlayd on %s has pid %d\n", n.Name, cmd.Process.Pid)
	return nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// PID returns the PID of the running overlayd, or 0.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil || n.proc.exited() {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Exited returns a channel closed when the current overlayd exits (nil if
// none was started) and a function returning how it ended.
func (n *Node) Exited() (<-chan struct{}, func() error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return nil, func() error { return nil }
	}
	p := n.proc
	return p.done, func() error { return p.err }
}

// stopTimeout bounds how long a SIGTERM'd overlayd may take to exit before
// it is killed.
const stopTimeout = 15 * time.Second

// Stop sends sig (SIGTERM or SIGKILL) to the overlayd this lab started on
// n and waits until it has exited; after SIGTERM it is killed if it does
// not exit within 15 s. It returns an error if a SIGTERM'd overlayd did not
// exit cleanly. Stopping a stopped node does nothing.
func (n *Node) Stop(sig syscall.Signal) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	// Only ever the PID of a process we started and have not reaped: it
	// cannot have been reused.
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal overlayd on %s: %w", n.Name, err)
	}
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("overlayd on %s (pid %d) did not exit within %s of %s; killed", n.Name, p.cmd.Process.Pid, stopTimeout, sig)
	}
	if sig == syscall.SIGKILL {
		return nil
	}
	if p.err != nil {
		return fmt.Errorf("overlayd on %s (pid %d) after %s: %w", n.Name, p.cmd.Process.Pid, sig, p.err)
	}
	return nil
}

// Restart stops overlayd with sig and starts it again.
func (n *Node) Restart(sig syscall.Signal) error {
	if err := n.Stop(sig); err != nil {
		return err
	}
	return n.Start()
}

// CLI runs `overlayd args...` in the host's namespace (for status and
// teardown, which talk to the local daemon or kernel) with the lab's etcd
// as --endpoints, and returns its standard output.
func (n *Node) CLI(ctx context.Context, args ...string) (out string, err error) {
	err = Do(n.NS, func() error {
		out, err = runCLI(ctx, n.lab.Binary("overlayd"), append([]string{"--endpoints=" + n.lab.Endpoint()}, args...))
		return err
	})
	return out, err
}

// Teardown runs `overlayd teardown` for this host (stop it first): the
// device, its routes, the lease and subnet.env go.
func (n *Node) Teardown(ctx context.Context) (string, error) {
	return n.CLI(ctx, append([]string{"teardown"}, n.hostArgs()...)...)
}

// get fetches path from the host's overlayd health endpoint.
func (n *Node) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+HealthAddr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// WaitReady polls the host's /readyz (from inside its namespace) until it
// answers 200. It fails at once if overlayd exits, and at ctx's end with
// the last reasons /readyz gave.
func (n *Node) WaitReady(ctx context.Context) error {
	done, how := n.Exited()
	if done == nil {
		return fmt.Errorf("overlayd on %s was never started", n.Name)
	}
	last := "no answer yet"
	for {
		code, body, err := n.get(ctx, "/readyz")
		switch {
		case err != nil:
			last = err.Error()
		case code == http.StatusOK:
			return nil
		default:
			last = fmt.Sprintf("%d: %s", code, strings.TrimSpace(string(body)))
		}
		select {
		case <-done:
			return fmt.Errorf("overlayd on %s exited (%v) before it was ready (see %s)", n.Name, how(), n.LogFile)
		case <-ctx.Done():
			return fmt.Errorf("overlayd on %s not ready: %w; /readyz: %s", n.Name, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Status is the part of overlayd's /status document the lab uses.
type Status struct {
	Node            string `json:"node"`
	PublicIP        string `json:"publicIP"`
	Subnet          string `json:"subnet"`
	Device          string `json:"device"`
	VtepMAC         string `json:"vtepMAC"`
	MTU             int    `json:"mtu"`
	PeersExpected   int    `json:"peersExpected"`
	PeersProgrammed int    `json:"peersProgrammed"`
	LastError       string `json:"lastError"`
	Ready           bool   `json:"ready"`
	// PeersIPv4Only and ConfigPending follow a roll of EnableIPv6.
	PeersIPv4Only int    `json:"peersIPv4Only"`
	ConfigPending string `json:"configPending"`
}

// Status fetches the host's /status.
func (n *Node) Status(ctx context.Context) (Status, error) {
	var st Status
	code, body, err := n.get(ctx, "/status")
	if err != nil {
		return st, fmt.Errorf("%s /status: %w", n.Name, err)
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("%s /status: HTTP %d", n.Name, code)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("%s /status: %w", n.Name, err)
	}
	return st, nil
}

// Env reads the host's subnet.env.
func (n *Node) Env() (subnet.Env, error) { return subnet.ReadEnv(n.SubnetFile) }

// Lease returns the subnet in the host's subnet.env.
func (n *Node) Lease() (netip.Prefix, error) {
	e, err := n.Env()
	if err != nil {
		return netip.Prefix{}, err
	}
	return e.Lease(), nil
}

// Route is a route overlayd programmed (protocol vxlan.RouteProtocol).
type Route struct {
	Dst    netip.Prefix
	Via    netip.Addr
	Dev    string
	Metric int
	Onlink bool
}

// String formats r like `ip route`.
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Dst.String())
	if r.Via.IsValid() {
		b.WriteString(" via " + r.Via.String())
	}
	fmt.Fprintf(&b, " dev %s proto %d", r.Dev, vxlan.RouteProtocol)
	if r.Metric != 0 {
		fmt.Fprintf(&b, " metric %d", r.Metric)
	}
	if r.Onlink {
		b.WriteString(" onlink")
	}
	return b.String()
}

// Routes lists the host's IPv4 overlay routes (ours by protocol), sorted.
func (n *Node) Routes() ([]Route, error) { return n.routes(unix.AF_INET) }

// IPv6Routes lists the host's IPv6 overlay routes, sorted.
func (n *Node) IPv6Routes() ([]Route, error) { return n.routes(unix.AF_INET6) }

// IPv6Lease returns the IPv6 subnet in the host's subnet.env (zero if the
// network carries no IPv6).
func (n *Node) IPv6Lease() (netip.Prefix, error) {
	e, err := n.Env()
	if err != nil {
		return netip.Prefix{}, err
	}
	return e.IPv6Lease(), nil
}

func (n *Node) routes(family int) ([]Route, error) {
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", n.NSName, err)
	}
	defer h.Close()
	var rs []netlink.Route
	for range 5 { // a dump interrupted by a concurrent change is retried
		rs, err = h.RouteListFiltered(family, &netlink.Route{Protocol: vxlan.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list routes in %s: %w", n.NSName, err)
	}
	names := map[int]string{}
	out := make([]Route, 0, len(rs))
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, _ := netip.AddrFromSlice(r.Dst.IP)
		dst = dst.Unmap()
		ones, _ := r.Dst.Mask.Size()
		rt := Route{Dst: netip.PrefixFrom(dst, ones), Metric: r.Priority, Onlink: r.Flags&unix.RTNH_F_ONLINK != 0}
		if r.Gw != nil {
			rt.Via, _ = netip.AddrFromSlice(r.Gw)
			rt.Via = rt.Via.Unmap()
		}
		name, ok := names[r.LinkIndex]
		if !ok {
			name = fmt.Sprintf("if%d", r.LinkIndex)
			if link, err := h.LinkByIndex(r.LinkIndex); err == nil {
				name = link.Attrs().Name
			}
			names[r.LinkIndex] = name
		}
		rt.Dev = name
		out = append(out, rt)
	}
	slices.SortFunc(out, func(a, b Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
	return out, nil
}

// RouteTo returns the overlay route to dst, if there is one.
func (n *Node) RouteTo(dst netip.Prefix) (Route, bool, error) {
	family := unix.AF_INET
	if dst.Addr().Is6() {
		family = unix.AF_INET6
	}
	rs, err := n.routes(family)
	if err != nil {
		return Route{}, false, err
	}
	for _, r := range rs {
		if r.Dst == dst {
			return r, true, nil
		}
	}
	return Route{}, false, nil
}

// DeleteRoute deletes the overlay route to dst by hand, as an operator's
// `ip route del` would.
func (n *Node) DeleteRoute(dst netip.Prefix) error {
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", n.NSName, err)
	}
	defer h.Close()
	r := &netlink.Route{
		Dst:      &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		Protocol: vxlan.RouteProtocol,
		Table:    unix.RT_TABLE_MAIN,
	}
	if rt, ok, err := n.RouteTo(dst); err != nil {
		return err
	} else if ok {
		r.Priority = rt.Metric
	}
	if err := h.RouteDel(r); err != nil {
		return fmt.Errorf("delete route %s in %s: %w", dst, n.NSName, err)
	}
	return nil
}

// Pods returns the host's pods.
func (n *Node) Pods() []*Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*Pod(nil), n.pods...)
}
