// Package lab builds simulated hosts out of network namespaces for tests,
// the demo and benchmarks:
//
//	ns <run>-ul: bridge "ul" (the underlay switch, 198.18.0.0/24, no address)
//	   ├── veth ── ns <run>-h1: eth0 198.18.0.1/24
//	   ├── veth ── ns <run>-h2: eth0 198.18.0.2/24
//	   └── ...
//
// Nothing is created in the root namespace and no namespace is connected to
// it. Every name starts with "ovl<pid>-", so leftovers of a run that crashed
// are found by name and removed when the next lab starts.
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
)

const (
	namePrefix = "ovl"
	netnsDir   = "/var/run/netns"
)

// newNamedNS creates a named network namespace (visible to `ip netns`)
// without moving the caller: netns.NewNamed switches the calling thread,
// so the thread is locked and switched back.
func newNamedNS(name string) (netns.NsHandle, error) {
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

// RemoveStale deletes namespaces left by lab runs whose process is gone.
func RemoveStale() error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		pid, ok := runPID(e.Name())
		if !ok || processAlive(pid) {
			continue
		}
		if err := netns.DeleteNamed(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("remove stale namespace %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// runPID parses the PID out of a lab namespace name "ovl<pid>-...".
func runPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, namePrefix)
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

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

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
	Iface  string     // "eth0"
}

// NewUnderlay creates the underlay namespace and bridge for a run tagged
// tag (empty for the process's default). Close removes everything.
func NewUnderlay(tag string) (*Underlay, error) {
	if err := RemoveStale(); err != nil {
		return nil, err
	}
	run := namePrefix + strconv.Itoa(os.Getpid()) + "-"
	if tag != "" {
		run += tag + "-"
	}
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

// AddHost creates host name (e.g. "h1") with eth0 = 198.18.0.<n>/24.
func (u *Underlay) AddHost(name string, n int) (*Host, error) {
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("host number %d out of 1..250", n)
	}
	h := &Host{Name: name, NSName: u.Run + name, IP: netip.AddrFrom4([4]byte{198, 18, 0, byte(n)}), Iface: "eth0"}
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
