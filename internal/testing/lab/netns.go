// Package lab builds a cluster of simulated hosts out of network namespaces,
// for the end-to-end tests, the demo and benchmarks:
//
//	ns <run>ul: bridge "ul" (the underlay switch, 198.18.0.0/24, no address)
//	   ├── veth ── ns <run>h1: eth0 198.18.0.1/24, overlayd, cni0, overlay.1
//	   │             ├── veth ── ns <run>h1-p1: eth0 10.244.x.2 (a pod)
//	   │             └── veth ── ns <run>h1-p2: ...
//	   ├── veth ── ns <run>h2: eth0 198.18.0.2/24 ...
//	   └── ...
//	etcd: embedded in the lab's process, on <work dir>/etcd.sock
//
// Underlay and Host are the namespaces alone (tests of the daemon use them
// directly). Lab adds the rest: a real etcd served on a unix socket — which a
// process in any namespace can reach, so no namespace needs a route to the
// root namespace — with the network config put; one real `overlayd run`
// process per host (Node), born in the host's namespace because it is
// forked from a thread switched into it, logging to a file in the work
// directory; and pods (Pod) attached through libcni with the project's
// conflist, overlay-cni and the upstream bridge and host-local plugins, each
// running a Responder for probes (Ping, WhoAmI, Stream).
//
// Nothing is created in the root namespace and no namespace is connected to
// it; no packet leaves the lab's namespaces (etcd's peer listener, which a
// single member never uses, sits on a loopback port). Every namespace name starts
// with "ovl<pid>-" and every work directory with "ovl-lab-<pid>-", so the
// leftovers of a run that crashed are found by name and removed when the
// next lab starts (RemoveStale). The lab only ever signals processes it
// started, by PID, and they die with it (PR_SET_PDEATHSIG).
package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

const (
	namePrefix = "ovl"
	netnsDir   = testenv.NetnsDir
)

// newNamedNS creates a named network namespace (visible to `ip netns`)
// without moving the caller: netns.NewNamed switches the calling thread,
// so the thread is locked and switched back.
func newNamedNS(name string) (netns.NsHandle, error) {
	if err := testenv.PrepareNetnsDir(); err != nil {
		return 0, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is in the wrong namespace; never let it run Go code again.
		panic(fmt.Sprintf("lab: cannot return to the original namespace: %v", serr))
	}
	if err != nil {
		return 0, fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return h, nil
}

// Do runs fn on a thread switched into ns, and switches back. Sockets fn
// opens belong to ns for their whole life.
func Do(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter namespace: %w", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("lab: cannot return to the original namespace: %v", err))
		}
	}()
	return fn()
}

// RemoveStale deletes namespaces left by lab runs whose process is gone,
// and their work directories ("ovl-lab-<pid>-*" in os.TempDir).
func RemoveStale() error {
	var errs []error
	for _, name := range namespacesWithPrefix(namePrefix) {
		pid, ok := runPID(namePrefix, name)
		if !ok || processAlive(pid) {
			continue
		}
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale namespace %s: %w", name, err))
		}
	}
	return errors.Join(append(errs, removeStaleDirs())...)
}

// StaleNamespaces lists the namespaces of lab runs whose process is gone.
func StaleNamespaces() []string {
	var out []string
	for _, name := range namespacesWithPrefix(namePrefix) {
		if pid, ok := runPID(namePrefix, name); ok && !processAlive(pid) {
			out = append(out, name)
		}
	}
	return out
}

// dirPrefix starts the name of a lab's own work directory in os.TempDir.
const dirPrefix = "ovl-lab-"

// removeStaleDirs deletes the work directories of labs whose process is gone.
func removeStaleDirs() error {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return nil // nothing we could clean
	}
	var errs []error
	for _, e := range entries {
		pid, ok := runPID(dirPrefix, e.Name())
		if !ok || !e.IsDir() || processAlive(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(os.TempDir(), e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove stale lab directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// namespacesWithPrefix lists the named namespaces (as `ip netns` sees them)
// whose name starts with prefix.
func namespacesWithPrefix(prefix string) []string {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// runPrefix is the namespace name prefix of this process's run tagged tag.
func runPrefix(tag string) string {
	run := namePrefix + strconv.Itoa(os.Getpid()) + "-"
	if tag != "" {
		run += tag + "-"
	}
	return run
}

// runPID parses the PID out of a name "<prefix><pid>-...".
func runPID(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}

// processAlive reports whether pid runs; a zombie (exited, not reaped —
// e.g. a detached demo whose new parent does not reap) does not.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc: trust kill
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}

// ProcessAlive reports whether pid runs (and is not a zombie).
func ProcessAlive(pid int) bool { return processAlive(pid) }

// Underlay is the shared L2 segment of a lab: a bridge in its own namespace.
type Underlay struct {
	Run     string // the per-run name prefix, e.g. "ovl1234-"
	NS      netns.NsHandle
	nsName  string
	h       *netlink.Handle
	bridge  int
	network netip.Prefix
	hosts   []*Host
}

// Host is a simulated host: a namespace with eth0 on the underlay.
type Host struct {
	Name   string // short name, e.g. "h1"
	NSName string // namespace name, e.g. "ovl1234-h1"
	NS     netns.NsHandle
	IP     netip.Addr // eth0's address
	IPv6   netip.Addr // eth0's IPv6 address (the underlay carries both families)
	Iface  string     // "eth0"
}

// UnderlayIPv6 is the underlay's IPv6 network; host n has address ::n.
var UnderlayIPv6 = netip.MustParsePrefix("fd18::/64")

// NewUnderlay creates the underlay namespace and bridge for a run tagged
// tag (empty for the process's default). Close removes everything.
func NewUnderlay(tag string) (*Underlay, error) {
	if err := RemoveStale(); err != nil {
		return nil, err
	}
	run := runPrefix(tag)
	u := &Underlay{Run: run, nsName: run + "ul", network: netip.MustParsePrefix("198.18.0.0/24")}
	// A leftover of this same process (an earlier test that failed hard).
	_ = netns.DeleteNamed(u.nsName)
	var err error
	if u.NS, err = newNamedNS(u.nsName); err != nil {
		return nil, err
	}
	if u.h, err = netlink.NewHandleAt(u.NS); err != nil {
		u.Close()
		return nil, fmt.Errorf("netlink in %s: %w", u.nsName, err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "ul", MTU: 1500}}
	if err := u.h.LinkAdd(br); err != nil {
		u.Close()
		return nil, fmt.Errorf("create underlay bridge: %w", err)
	}
	if err := u.h.LinkSetUp(br); err != nil {
		u.Close()
		return nil, fmt.Errorf("bring up underlay bridge: %w", err)
	}
	u.bridge = br.Attrs().Index
	for _, l := range []string{"lo"} {
		if lo, err := u.h.LinkByName(l); err == nil {
			_ = u.h.LinkSetUp(lo)
		}
	}
	return u, nil
}

// AddHost creates host name (e.g. "h1") with eth0 = 198.18.0.<n>/24 and
// fd18::<n>/64 (without duplicate address detection, so it is usable at
// once).
func (u *Underlay) AddHost(name string, n int) (*Host, error) {
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("host number %d out of 1..250", n)
	}
	v6 := UnderlayIPv6.Addr().As16()
	v6[15] = byte(n)
	h := &Host{Name: name, NSName: u.Run + name, IP: netip.AddrFrom4([4]byte{198, 18, 0, byte(n)}), IPv6: netip.AddrFrom16(v6), Iface: "eth0"}
	_ = netns.DeleteNamed(h.NSName)
	var err error
	if h.NS, err = newNamedNS(h.NSName); err != nil {
		return nil, err
	}
	u.hosts = append(u.hosts, h)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "v-" + name, MasterIndex: u.bridge, MTU: 1500},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(h.NS),
	}
	if err := u.h.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("create veth for %s: %w", name, err)
	}
	if err := u.h.LinkSetUp(veth); err != nil {
		return nil, fmt.Errorf("bring up veth for %s: %w", name, err)
	}
	hh, err := netlink.NewHandleAt(h.NS)
	if err != nil {
		return nil, err
	}
	defer hh.Close()
	eth0, err := hh.LinkByName("eth0")
	if err != nil {
		return nil, fmt.Errorf("%s eth0: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: h.IP.AsSlice(), Mask: net.CIDRMask(u.network.Bits(), 32)}}
	if err := hh.AddrAdd(eth0, addr); err != nil {
		return nil, fmt.Errorf("%s: address %s: %w", name, h.IP, err)
	}
	addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: h.IPv6.AsSlice(), Mask: net.CIDRMask(UnderlayIPv6.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	if err := hh.AddrAdd(eth0, addr6); err != nil {
		return nil, fmt.Errorf("%s: address %s: %w", name, h.IPv6, err)
	}
	for _, l := range []string{"eth0", "lo"} {
		link, err := hh.LinkByName(l)
		if err != nil {
			return nil, err
		}
		if err := hh.LinkSetUp(link); err != nil {
			return nil, fmt.Errorf("%s: bring up %s: %w", name, l, err)
		}
	}
	return h, nil
}

// Outside is an address of each family on the underlay bridge itself, in
// the underlay's namespace: a destination outside every cluster network
// that hosts reach directly, for testing masquerade. Its Responders answer
// on ProbePort.
type Outside struct {
	IP, IPv6   netip.Addr
	responders []*Responder
}

// Close stops the responders (the addresses go with the underlay).
func (o *Outside) Close() {
	for _, r := range o.responders {
		r.Close()
	}
}

// AddOutside puts 198.18.0.254/24 and fd18::fe/64 on the underlay bridge and
// serves probes there.
func (u *Underlay) AddOutside() (*Outside, error) {
	v6 := UnderlayIPv6.Addr().As16()
	v6[15] = 0xfe
	o := &Outside{IP: netip.AddrFrom4([4]byte{198, 18, 0, 254}), IPv6: netip.AddrFrom16(v6)}
	br, err := u.h.LinkByIndex(u.bridge)
	if err != nil {
		return nil, fmt.Errorf("underlay bridge: %w", err)
	}
	for _, a := range []*netlink.Addr{
		{IPNet: &net.IPNet{IP: o.IP.AsSlice(), Mask: net.CIDRMask(u.network.Bits(), 32)}},
		{IPNet: &net.IPNet{IP: o.IPv6.AsSlice(), Mask: net.CIDRMask(UnderlayIPv6.Bits(), 128)}, Flags: unix.IFA_F_NODAD},
	} {
		if err := u.h.AddrAdd(br, a); err != nil {
			return nil, fmt.Errorf("outside address %s: %w", a.IPNet, err)
		}
	}
	for _, ip := range []netip.Addr{o.IP, o.IPv6} {
		r, err := Serve(u.NS, ip, ProbePort)
		if err != nil {
			o.Close()
			return nil, err
		}
		o.responders = append(o.responders, r)
	}
	return o, nil
}

// RemoveHost deletes a host's namespace (its veth goes with it).
func (u *Underlay) RemoveHost(h *Host) error {
	for i, x := range u.hosts {
		if x == h {
			u.hosts = append(u.hosts[:i], u.hosts[i+1:]...)
			break
		}
	}
	h.NS.Close()
	if err := netns.DeleteNamed(h.NSName); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", h.NSName, err)
	}
	return nil
}

// Close removes every namespace of the run. Safe to call twice.
func (u *Underlay) Close() error {
	var errs []error
	for len(u.hosts) > 0 {
		if err := u.RemoveHost(u.hosts[0]); err != nil {
			errs = append(errs, err)
		}
	}
	if u.h != nil {
		u.h.Close()
		u.h = nil
	}
	if u.NS.IsOpen() {
		u.NS.Close()
	}
	if err := netns.DeleteNamed(u.nsName); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// Anything else of this run (a host added by name elsewhere).
	matches, _ := filepath.Glob(filepath.Join(netnsDir, u.Run+"*"))
	for _, m := range matches {
		_ = netns.DeleteNamed(filepath.Base(m))
	}
	return errors.Join(errs...)
}
