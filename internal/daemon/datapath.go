package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/guard"
)

// Start-up refuses, before anything is claimed in etcd, a host that could
// not build the data path: a lease published by such a host makes every
// peer route its pods' traffic to a host with no VXLAN device.
var (
	// ErrNoNetAdmin: the process lacks CAP_NET_ADMIN.
	ErrNoNetAdmin = errors.New("overlayd needs CAP_NET_ADMIN")
	// ErrPortInUse: another device or socket holds the VXLAN UDP port.
	ErrPortInUse = errors.New("VXLAN UDP port in use")
	// ErrGuardUnsupported: --vxlan-guard is on and the kernel cannot run
	// the guard's nftables table.
	ErrGuardUnsupported = errors.New("the kernel cannot run the VXLAN guard (--vxlan-guard)")
)

// portInUse is an ErrPortInUse said in one sentence.
type portInUse string

func (e portInUse) Error() string        { return string(e) }
func (e portInUse) Is(target error) bool { return target == ErrPortInUse }

// DataPath is what the data path of this run needs from the host: the
// VXLAN VNI and UDP port, the address families, and the devices that may
// hold the port already and are this run's to keep, take over or remove
// (overlayd's own of an earlier run, flanneld's with --adopt-flannel).
type DataPath struct {
	VNI, Port  int
	IPv4, IPv6 bool
	Devices    []string
	// Guard: --vxlan-guard is on, so nftables must take the guard's table.
	Guard bool
}

// dataPath is this run's DataPath, once the network config is read and
// flanneld's devices looked for.
func (d *daemon) dataPath() DataPath {
	nc := d.netCfg
	p := DataPath{VNI: nc.Backend.VNI, Port: nc.Backend.Port, IPv4: nc.EnableIPv4, IPv6: nc.EnableIPv6, Guard: d.cfg.VXLANGuard}
	// overlayd's own devices of an earlier run, of either family: one of
	// a family the network no longer carries (IPv6 turned off) holds the
	// port until start-up removes it.
	for _, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		if name, err := planeDevice(nc.Backend, fam); err == nil {
			p.Devices = append(p.Devices, name)
		}
	}
	for _, fp := range d.planes {
		if fp.flannel.name != "" {
			p.Devices = append(p.Devices, fp.flannel.name)
		}
	}
	return p
}

// capNetAdmin reports whether the calling thread has CAP_NET_ADMIN in its
// effective set (capabilities are per thread; a process's threads share
// them unless one changes its own).
func capNetAdmin() (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("read this process's capabilities: %w", err)
	}
	return data[unix.CAP_NET_ADMIN/32].Effective&(1<<(unix.CAP_NET_ADMIN%32)) != 0, nil
}

// checkDataPath is Kernel.CheckDataPath of the host's kernel, in ns.
func (k hostKernel) CheckDataPath(p DataPath) error {
	switch ok, err := capNetAdmin(); {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%w to create its VXLAN device and program routes: run it as root or grant the capability (systemd: AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW; Kubernetes: securityContext.capabilities.add: [NET_ADMIN, NET_RAW])", ErrNoNetAdmin)
	}
	return inNetns(k.ns, func() error {
		if err := ownsNetns(); err != nil {
			return err
		}
		if err := checkPort(p); err != nil {
			return err
		}
		if p.Guard {
			// A kernel without the guard's nftables parts fails here, before
			// a lease is claimed, not at the first reconcile pass, where it
			// would stop the data plane.
			if err := guard.Probe(netns.None()); err != nil {
				return fmt.Errorf("%w: %w (or run overlayd with --vxlan-guard=false)", ErrGuardUnsupported, err)
			}
		}
		return nil
	})
}

// The ioctls of nsfs (linux/nsfs.h) that open a namespace's owning user
// namespace and a user namespace's parent.
const (
	nsGetUserns = 0xb701
	nsGetParent = 0xb702
)

// ownsNetns, run in the network namespace to program, checks that the
// capabilities capget reports count there: they are those of this
// process's user namespace, which must own the network namespace or be an
// ancestor of its owner. In a user namespace of its own (a rootless
// container), root has every capability, but not over the host's network.
func ownsNetns() error {
	self, err := nsInode("/proc/self/ns/user")
	if err != nil {
		return nil // no namespaces to compare (a kernel without them)
	}
	nsf, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil
	}
	defer nsf.Close()
	notOwner := fmt.Errorf("%w in the user namespace that owns its network namespace, and it runs in a user namespace of its own (a rootless container?), where its capabilities do not count for the host's network: run it in the host's user namespace as root, or grant the capability there", ErrNoNetAdmin)
	fd, err := unix.IoctlRetInt(int(nsf.Fd()), nsGetUserns)
	switch {
	case errors.Is(err, unix.EPERM):
		// The owner is outside this process's user namespace.
		return notOwner
	case err != nil:
		return nil // a kernel before 4.9: cannot tell; the device creation will
	}
	if !userNSAncestry(fd, self, nsSyscalls{
		inode: func(fd int) (uint64, error) {
			var st unix.Stat_t
			err := unix.Fstat(fd, &st)
			return st.Ino, err
		},
		parent: func(fd int) (int, error) { return unix.IoctlRetInt(fd, nsGetParent) },
		close:  func(fd int) { unix.Close(fd) },
	}) {
		return notOwner
	}
	return nil
}

// nsSyscalls are the system calls userNSAncestry makes (tests fake them).
type nsSyscalls struct {
	inode  func(fd int) (uint64, error)
	parent func(fd int) (int, error) // NS_GET_PARENT: a new fd
	close  func(fd int)
}

// userNSAncestry reports whether the user namespace open as fd, or one of
// its ancestors, is the one of inode self. It closes fd and every fd it
// opens.
func userNSAncestry(fd int, self uint64, sys nsSyscalls) bool {
	for {
		ino, err := sys.inode(fd)
		if err == nil && ino == self {
			sys.close(fd)
			return true
		}
		parent, perr := sys.parent(fd)
		sys.close(fd)
		switch {
		case perr != nil:
			// EPERM: the owner's ancestry leaves this process's user
			// namespace without passing through it.
			return false
		case err != nil:
			sys.close(parent) // opened, but the namespace it came from is unknown
			return false
		}
		fd = parent
	}
}

func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// checkPort, run in the host's network namespace, finds what would keep
// the VXLAN device of p from being created or brought up: another VXLAN
// device with the same VNI and port (the kernel refuses a second), or a
// socket bound to the port (the device cannot open its own).
func checkPort(p DataPath) error {
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list links to check UDP port %d: %w", p.Port, err)
	}
	// The port of a family is held by a VXLAN device that is up (its
	// kernel socket), of that family by its local address.
	held := map[uint8]bool{}
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.Port != p.Port {
			continue
		}
		if vx.Attrs().Flags&net.FlagUp != 0 {
			held[unix.AF_INET] = held[unix.AF_INET] || vx.SrcAddr == nil || vx.SrcAddr.To4() != nil
			held[unix.AF_INET6] = held[unix.AF_INET6] || vx.SrcAddr == nil || vx.SrcAddr.To4() == nil
		}
		if slices.Contains(p.Devices, vx.Name) || vx.VxlanId != p.VNI {
			// Ours (from an earlier run) or flanneld's being taken over;
			// or another VNI, which the kernel lets share the port.
			continue
		}
		advice := "delete it, or give this network another Backend.Port or Backend.VNI in the network config"
		if strings.HasPrefix(vx.Name, "flannel") {
			advice = "it is flanneld's: stop flanneld and start overlayd with --adopt-flannel to take it over (Documentation/migrating-from-flannel.md), or delete it"
		}
		return portInUse(fmt.Sprintf("UDP port %d is in use by VXLAN device %s (VNI %d): %s; see `ip -d link show type vxlan`", p.Port, vx.Name, vx.VxlanId, advice))
	}
	for _, fam := range []struct {
		on      bool
		network string
		addr    string
		family  uint8
	}{{p.IPv4, "udp4", "0.0.0.0", unix.AF_INET}, {p.IPv6, "udp6", "[::]", unix.AF_INET6}} {
		if !fam.on {
			continue
		}
		c, err := net.ListenPacket(fam.network, fam.addr+":"+strconv.Itoa(p.Port))
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return fmt.Errorf("check UDP port %d: %w", p.Port, err)
		}
		if held[fam.family] {
			continue // a VXLAN device's socket: ours, or one that shares it
		}
		return portInUse(fmt.Sprintf("UDP port %d is in use by %s: stop it, or give this network another Backend.Port in the network config; see `ss -ulpn`", p.Port, udpPortOwner(fam.family, p.Port)))
	}
	return nil
}

// udpPortOwner names the process holding a UDP socket on port, as well as
// it can: "nc (pid 4242)", or "a socket of no process found".
func udpPortOwner(family uint8, port int) string {
	socks, err := netlink.SocketDiagUDP(family)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return "a socket"
	}
	inodes := map[string]bool{}
	for _, s := range socks {
		if int(s.ID.SourcePort) == port && s.INode != 0 {
			inodes["socket:["+strconv.FormatUint(uint64(s.INode), 10)+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return "a socket of no process found"
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		target, err := os.Readlink(fd)
		if err != nil || !inodes[target] {
			continue
		}
		dir := filepath.Dir(filepath.Dir(fd))
		pid := filepath.Base(dir)
		comm, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil {
			return "pid " + pid
		}
		return strings.TrimSpace(string(comm)) + " (pid " + pid + ")"
	}
	return "a socket of no process found"
}
