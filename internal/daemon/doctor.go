package daemon

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/doctor"
	"github.com/overlaynet/overlay/subnet"
)

// DiagnoseOptions say where `overlayd doctor` looks besides Config.
type DiagnoseOptions struct {
	// CNIConfDir is the container runtime's CNI config directory.
	CNIConfDir string
	// KernelRelease, if set, replaces uname's (tests of the checksum
	// check on a kernel that has the fix).
	KernelRelease string
	// Guard reads the VXLAN guard's sets; nil: the kernel's (the
	// nftables table backend/guard keeps). Health reads the daemon's
	// per-peer health (issue 32); nil: there is none to read, and its
	// check says so in a note.
	Guard  GuardReader
	Health HealthReader
}

// GuardReader reads the VXLAN guard's admitted addresses, read only.
type GuardReader interface {
	// Admitted returns the addresses the guard admits to the VXLAN port
	// for family "ip" or "ip6", and whether the guard is on at all.
	Admitted(family string) (addrs []netip.Addr, enabled bool, err error)
}

// HealthReader reads the local daemon's per-peer health summary.
type HealthReader interface {
	PeerHealth() (*doctor.Health, error)
}

// Diagnose gathers, read only, the facts `overlayd doctor` judges
// (doctor.Run): this host's kernel state in cfg.NetNS, its subnet.env and
// CNI config, against the network config nc and the leases of snap as the
// store holds them. It writes nothing anywhere. What it cannot read it
// records in Facts.Missing, by check, and goes on.
func Diagnose(cfg Config, nc *subnet.Config, snap subnet.Snapshot, opts DiagnoseOptions) (doctor.Facts, error) {
	cfg.defaults()
	f := doctor.Facts{Missing: map[string]string{}, Sysctls: map[string]string{},
		IPv4: nc.EnableIPv4, IPv6: nc.EnableIPv6, Network: nc.Network, IPv6Network: nc.IPv6.Network,
		Port: nc.Backend.Port, VNI: nc.Backend.VNI}
	f.KernelRelease = opts.KernelRelease
	if f.KernelRelease == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err == nil {
			f.KernelRelease = unix.ByteSliceToString(u.Release[:])
		}
	}
	nodeID, err := NodeID(cfg.NodeName, cfg.MachineIDFile)
	if err != nil {
		return f, err
	}
	ul, err := cfg.Kernel.TeardownUnderlay(cfg.Iface, cfg.PublicIP, cfg.PublicIPv6)
	if errors.Is(err, errNoNetlink) {
		return f, err
	}
	if err != nil {
		return f, fmt.Errorf("find the underlay interface: %w: pass --iface or --public-ip", err)
	}
	var own subnet.Lease
	for _, l := range snap.Leases {
		if l.Attrs.OwnedBy(nodeID, ul.PublicIP, ul.PublicIPv6) {
			own, f.HasLease = l, true
			break
		}
	}
	f.Lease, f.IPv6Lease = own.Subnet, own.IPv6Subnet

	f.Env = readSubnetEnv(cfg.SubnetFile)
	f.CNI = readCNIConfDir(opts.CNIConfDir)
	if env, err := os.Stat(cfg.SubnetFile); err == nil {
		for i, file := range f.CNI.Files {
			if conf, err := os.Stat(cmp.Or(file.SubnetFile, subnet.DefaultEnvFile)); err == nil && file.HasOverlay {
				f.CNI.Files[i].SameSubnetFile = os.SameFile(env, conf)
			}
		}
	}

	if opts.Health != nil {
		if f.Health, err = opts.Health.PeerHealth(); err != nil {
			f.Missing["peer-health"] = err.Error()
		}
	}
	if opts.Guard == nil {
		opts.Guard = kernelGuard{port: nc.Backend.Port}
	}
	err = inNetns(cfg.NetNS, func() error {
		gatherLinks(&f, cfg, nc, ul, nodeID, own, snap, opts.Guard)
		gatherSysctls(&f, ul.Iface)
		gatherFirewall(&f, nc)
		gatherPort(&f)
		return nil
	})
	return f, err
}

// gatherLinks reads the underlay, the overlay devices (with the audit of
// their entries against the leases), the CNI bridge and its ports.
func gatherLinks(f *doctor.Facts, cfg Config, nc *subnet.Config, ul Underlay, nodeID string, own subnet.Lease, snap subnet.Snapshot, guard GuardReader) {
	h, err := netlink.NewHandle()
	if err != nil {
		for _, c := range []string{"mtu", "kernel-entries", "checksum-offload", "rp-filter"} {
			f.Missing[c] = "open netlink: " + err.Error()
		}
		return
	}
	defer h.Close()
	if l, err := h.LinkByName(ul.Iface); err == nil {
		f.Underlay = doctor.Link{Name: ul.Iface, MTU: l.Attrs().MTU}
	} else {
		f.Underlay = doctor.Link{Name: ul.Iface, Missing: true}
	}

	var peers *peerSet
	if codec, err := codecs.For(nc.Backend); err != nil {
		f.Missing["kernel-entries"] = err.Error()
	} else {
		peers = newPeerSet(nc, codec, own.Subnets(), func(s subnet.Subnets) string { return s.String() })
		peers.reset(snap)
	}
	nl, err := vxlan.OpenNetlink(netns.None()) // this thread's namespace: cfg.NetNS
	if err != nil {
		f.Missing["kernel-entries"] = err.Error()
	} else {
		defer nl.Close()
	}
	for _, fam := range families(nc) {
		name, err := planeDevice(nc.Backend, fam)
		if err != nil {
			f.Missing["kernel-entries"] = err.Error()
			continue
		}
		spec := PlaneSpec{Backend: nc.Backend, Family: fam, Underlay: ul.Iface, LocalIP: ul.localIP(fam),
			OwnSubnet: ownSubnet(own, fam), NodeID: nodeID}
		// A device taken over from flanneld is the plane's, with its MAC.
		if _, err := h.LinkByName(name); err != nil {
			fl := flannelDeviceName(fam, nc.Backend.VNI)
			if l, err := h.LinkByName(fl); err == nil && (l.Attrs().Alias == TakenOverAlias || (hostKernel{ns: netns.None()}).TakenOver(fl, fam)) {
				name, spec.Device, spec.MAC = fl, fl, l.Attrs().HardwareAddr
			}
		}
		dev := doctor.Link{Name: name, Family: fam.String(), WantMTU: nc.Backend.MTU}
		if dev.WantMTU == 0 && f.Underlay.MTU > 0 {
			dev.WantMTU = f.Underlay.MTU - overheadOf(fam)
		}
		if l, err := h.LinkByName(name); err == nil {
			dev.MTU = l.Attrs().MTU
			dev.TxCsum, err = txChecksum(name)
			if err != nil {
				dev.TxCsumErr = err.Error()
			}
		} else {
			dev.Missing = true
		}
		f.Devices = append(f.Devices, dev)
		if nl == nil || peers == nil {
			continue
		}
		res, err := vxlan.Audit(spec.vxlanConfig(), nl, peers.peers(fam))
		if err != nil {
			f.Missing["kernel-entries"] = fmt.Sprintf("%s: %v", name, err)
			continue
		}
		gatherGuard(f, guard, fam, res.Peers)
		if !f.HasLease {
			// The device's address is its lease's: without one, only the
			// peers' entries can be judged (the missing lease is reported).
			res.DeviceProblem = ""
		}
		f.Entries = append(f.Entries, auditOf(res))
	}

	bridge := "cni0"
	for _, file := range f.CNI.Files {
		if file.HasOverlay && file.Bridge != "" {
			bridge = file.Bridge
			break
		}
	}
	f.Bridge = doctor.Link{Name: bridge, Missing: true}
	br, err := h.LinkByName(bridge)
	if err != nil {
		return
	}
	f.Bridge = doctor.Link{Name: bridge, MTU: br.Attrs().MTU}
	links, err := h.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		f.Missing["mtu"] = "list links: " + err.Error()
		return
	}
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && l.Type() == "veth" {
			f.Ports = append(f.Ports, doctor.Link{Name: l.Attrs().Name, MTU: l.Attrs().MTU})
		}
	}
}

// kernelGuard reads the VXLAN guard overlayd keeps (backend/guard) in the
// calling thread's namespace: the set of a family and whether its set,
// chain and rule are all in place.
type kernelGuard struct{ port int }

func (g kernelGuard) Admitted(family string) ([]netip.Addr, bool, error) {
	fam := backend.IPv4
	if family == "ip6" {
		fam = backend.IPv6
	}
	s, err := guard.Read(netns.None(), fam, g.port)
	return s.Admitted, s.Present, err
}

// gatherGuard records the guard's set of family fam and what the leases
// want in it: the public address of every peer the data plane programs
// (the VXLAN plane admits exactly those).
func gatherGuard(f *doctor.Facts, g GuardReader, fam backend.Family, peers []backend.Peer) {
	name := "ip"
	if fam == backend.IPv6 {
		name = "ip6"
	}
	admitted, enabled, err := g.Admitted(name)
	if err != nil {
		f.Missing["vxlan-guard"] = err.Error()
		return
	}
	if f.Guard == nil {
		f.Guard = &doctor.Guard{Enabled: enabled, Admitted: map[string][]netip.Addr{}, Want: map[string][]netip.Addr{}}
	}
	f.Guard.Enabled = f.Guard.Enabled && enabled
	f.Guard.Admitted[name] = admitted
	for _, p := range peers {
		f.Guard.Want[name] = append(f.Guard.Want[name], p.PublicIP)
	}
}

func overheadOf(fam backend.Family) int {
	if fam == backend.IPv6 {
		return vxlan.OverheadV6
	}
	return vxlan.Overhead
}

func auditOf(r vxlan.AuditResult) doctor.Audit {
	a := doctor.Audit{Device: r.Device, Missing: r.Missing, DeviceProblem: r.DeviceProblem, Conflicts: r.Conflicts, Rejected: r.Rejected}
	for _, d := range r.Drift {
		a.Drift = append(a.Drift, doctor.Drift{Kind: d.Kind, Peer: d.Peer, Stale: d.Stale, Entry: d.Entry})
	}
	return a
}

// txChecksum reports whether transmit checksum offload is on for the
// device name (ETHTOOL_GTXCSUM: any of the checksum features, for a
// VXLAN device tx-checksum-ip-generic), in this thread's namespace.
func txChecksum(name string) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	val := &struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_GTXCSUM}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte // the rest of struct ifreq's union
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], name)
	ifr.data = unsafe.Pointer(val)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(val)
	if errno != 0 {
		return false, fmt.Errorf("ethtool get tx checksumming of %s: %w", name, errno)
	}
	return val.data != 0, nil
}

// sysctlPath is the /proc/sys file of a sysctl given as its path parts
// (an interface name may hold a dot, so names are not split).
func sysctlPath(parts ...string) string {
	return filepath.Join(append([]string{"/proc/sys"}, parts...)...)
}

// gatherSysctls reads the sysctls the checks need, in this thread's
// namespace (the /proc/sys/net files are the namespace's of the thread
// that opens them).
func gatherSysctls(f *doctor.Facts, underlay string) {
	read := func(name string, parts ...string) {
		b, err := os.ReadFile(sysctlPath(parts...))
		if err == nil {
			f.Sysctls[name] = strings.TrimSpace(string(b))
		}
	}
	read("net.ipv4.ip_forward", "net", "ipv4", "ip_forward")
	read("net.ipv6.conf.all.forwarding", "net", "ipv6", "conf", "all", "forwarding")
	read("net.ipv4.conf.all.rp_filter", "net", "ipv4", "conf", "all", "rp_filter")
	devs := []string{underlay}
	for _, d := range f.Devices {
		devs = append(devs, d.Name)
	}
	for _, d := range devs {
		if d != "" {
			read("net.ipv4.conf."+d+".rp_filter", "net", "ipv4", "conf", d, "rp_filter")
		}
	}
	read("net.bridge.bridge-nf-call-iptables", "net", "bridge", "bridge-nf-call-iptables")
	read("net.bridge.bridge-nf-call-ip6tables", "net", "bridge", "bridge-nf-call-ip6tables")
}

// gatherFirewall reads every nftables chain on the forward hook (but in
// overlayd's own table) with its rules and the chains they jump to, finds
// kube-proxy by its chains, and lists the legacy iptables tables.
func gatherFirewall(f *doctor.Facts, nc *subnet.Config) {
	for _, file := range []string{"ip_tables_names", "ip6_tables_names"} {
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not of this one.
		if b, err := os.ReadFile("/proc/thread-self/net/" + file); err == nil {
			for _, t := range strings.Fields(string(b)) {
				name := t
				if file == "ip6_tables_names" {
					name = "ip6 " + t
				}
				f.LegacyTables = append(f.LegacyTables, name)
			}
		}
	}
	c, err := nftables.New()
	if err != nil {
		f.Missing["forward-policy"] = "open nftables: " + err.Error()
		return
	}
	defer c.CloseLasting()
	chains, err := c.ListChains()
	if err != nil {
		f.Missing["forward-policy"] = "list nftables chains: " + err.Error()
		return
	}
	f.Chains = map[string]doctor.Chain{}
	for _, ch := range chains {
		if ch.Table == nil {
			continue
		}
		fam := masq.FamilyName(ch.Table.Family)
		if ch.Table.Name == "kube-proxy" || ch.Name == "KUBE-SERVICES" || ch.Name == "KUBE-FORWARD" {
			if f.KubeProxy == "" {
				f.KubeProxy = fmt.Sprintf("nftables chain %s %s %s", fam, ch.Table.Name, ch.Name)
			}
		}
		if ch.Table.Name == masq.TableName && (fam == "inet" || fam == "ip") {
			continue // ours: no forward chain, and its rules are NAT
		}
		if fam != "inet" && fam != "ip" && fam != "ip6" {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			f.Missing["forward-policy"] = fmt.Sprintf("list the rules of %s %s %s: %v", fam, ch.Table.Name, ch.Name, err)
			return
		}
		dc := doctor.Chain{Family: fam, Table: ch.Table.Name, Name: ch.Name}
		for _, r := range rules {
			dc.Rules = append(dc.Rules, ruleOf(r))
		}
		if ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookForward && ch.Policy != nil {
			dc.Policy = "accept"
			if *ch.Policy == nftables.ChainPolicyDrop {
				dc.Policy = "drop"
			}
			f.ForwardChains = append(f.ForwardChains, dc)
		}
		f.Chains[dc.ID()] = dc
	}
	slices.SortFunc(f.ForwardChains, func(a, b doctor.Chain) int { return cmp.Compare(a.ID(), b.ID()) })
}

// ruleOf reduces an nftables rule to its address and interface matches
// and its verdict: a payload load of the IPv4 or IPv6 source or
// destination address, optionally masked, compared for equality, is a
// prefix match; iifname and oifname compared for equality are interface
// matches; every other comparison, lookup or match (conntrack, marks,
// sets, iptables-nft's xt matches) is "other" — but the inet family's
// protocol match, which only says the family.
func ruleOf(r *nftables.Rule) doctor.Rule {
	var out doctor.Rule
	var field string // "src", "dst" or "" for the last load
	var mask []byte
	var protoMeta bool
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Payload:
			field, mask, protoMeta = "", nil, false
			if e.Base == expr.PayloadBaseNetworkHeader {
				switch {
				case e.Len == 4 && e.Offset == 12, e.Len == 16 && e.Offset == 8:
					field = "src"
				case e.Len == 4 && e.Offset == 16, e.Len == 16 && e.Offset == 24:
					field = "dst"
				}
			}
		case *expr.Meta:
			field, mask = "", nil
			protoMeta = e.Key == expr.MetaKeyNFPROTO
			switch e.Key {
			case expr.MetaKeyIIFNAME:
				field = "iif"
			case expr.MetaKeyOIFNAME:
				field = "oif"
			}
		case *expr.Bitwise:
			mask = e.Mask
		case *expr.Cmp:
			p, ok := prefixOfMatch(e, mask)
			switch {
			case protoMeta:
			case (field == "iif" || field == "oif") && e.Op == expr.CmpOpEq && mask == nil:
				if field == "iif" {
					out.IIf = ifaceOfMatch(e.Data)
				} else {
					out.OIf = ifaceOfMatch(e.Data)
				}
			case (field == "src" || field == "dst") && ok && e.Op == expr.CmpOpEq:
				if field == "src" {
					out.Src = p
				} else {
					out.Dst = p
				}
			default:
				out.Other = true
			}
			field, mask, protoMeta = "", nil, false
		case *expr.Verdict:
			out.Verdict, out.Target = verdictName(e.Kind), e.Chain
		case *expr.Counter:
		default:
			out.Other = true
		}
	}
	return out
}

// ifaceOfMatch is an interface name comparison as doctor.Rule holds it:
// the name (the data is NUL-padded), or "prefix+" for a comparison of a
// prefix only (iptables' "cni+").
func ifaceOfMatch(data []byte) string {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return string(data[:i])
	}
	return string(data) + "+"
}

// prefixOfMatch is the prefix an address comparison matches: the
// address compared to, with the mask's length (a full one without).
func prefixOfMatch(c *expr.Cmp, mask []byte) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(c.Data)
	if !ok {
		return netip.Prefix{}, false
	}
	bits := a.BitLen()
	if mask != nil {
		ones, total := net.IPMask(mask).Size()
		if total == 0 {
			return netip.Prefix{}, false // not a prefix mask
		}
		bits = ones
	}
	return netip.PrefixFrom(a, bits).Masked(), true
}

func verdictName(k expr.VerdictKind) string {
	switch k {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictJump:
		return "jump"
	case expr.VerdictGoto:
		return "goto"
	case expr.VerdictReturn:
		return "return"
	}
	return ""
}

// gatherPort finds the other users of the VXLAN port: VXLAN devices on
// it that are not overlay's, and sockets of processes bound to it. A
// socket no process holds is a VXLAN device's (the kernel's) when a
// device of its family is up on the port: it is not reported.
func gatherPort(f *doctor.Facts) {
	ours := map[string]bool{}
	for _, d := range f.Devices {
		ours[d.Name] = true
	}
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		f.Missing["vxlan-port"] = "list links: " + err.Error()
		return
	}
	kernel := map[uint8]bool{} // a VXLAN device of the family is up on the port
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.Port != f.Port {
			continue
		}
		if vx.Attrs().Flags&net.FlagUp != 0 {
			kernel[unix.AF_INET] = kernel[unix.AF_INET] || vx.SrcAddr == nil || vx.SrcAddr.To4() != nil
			kernel[unix.AF_INET6] = kernel[unix.AF_INET6] || vx.SrcAddr == nil || vx.SrcAddr.To4() == nil
		}
		if !ours[vx.Name] {
			f.PortUsers = append(f.PortUsers, fmt.Sprintf("VXLAN device %s (VNI %d)", vx.Name, vx.VxlanId))
		}
	}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagUDP(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			f.Missing["vxlan-port"] = "list UDP sockets: " + err.Error()
			return
		}
		for _, s := range socks {
			if int(s.ID.SourcePort) != f.Port {
				continue
			}
			owner, found := socketOwner(s.INode)
			if !found && kernel[fam] {
				continue
			}
			f.PortUsers = append(f.PortUsers, fmt.Sprintf("a socket on %s of %s", net.JoinHostPort(s.ID.Source.String(), strconv.Itoa(f.Port)), owner))
		}
	}
}

// socketOwner names the process holding the socket with inode ino: "nc
// (pid 4242)", or "no process found" (and false).
func socketOwner(ino uint32) (string, bool) {
	target := "socket:[" + strconv.FormatUint(uint64(ino), 10) + "]"
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if t, err := os.Readlink(fd); err != nil || t != target {
			continue
		}
		dir := filepath.Dir(filepath.Dir(fd))
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		return fmt.Sprintf("%s (pid %s)", cmp.Or(strings.TrimSpace(string(comm)), "?"), filepath.Base(dir)), true
	}
	return "no process found", false
}

func readSubnetEnv(path string) doctor.SubnetEnv {
	e := doctor.SubnetEnv{Path: path}
	env, err := subnet.ReadEnv(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		e.Missing = true
	case err != nil:
		e.Err = err.Error()
	default:
		e.Network, e.Subnet, e.MTU = env.Network, env.Lease(), env.MTU
		e.IPv6Network, e.IPv6Subnet = env.IPv6Network, env.IPv6Lease()
	}
	return e
}

// readCNIConfDir reads the network configs of dir as a runtime picks
// them: files ending .conf, .conflist or .json, in name order.
func readCNIConfDir(dir string) doctor.CNIConfig {
	c := doctor.CNIConfig{Dir: dir}
	entries, err := os.ReadDir(dir)
	if err != nil {
		c.Err = err.Error()
		return c
	}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || ext != ".conf" && ext != ".conflist" && ext != ".json" {
			continue
		}
		c.Files = append(c.Files, readCNIFile(filepath.Join(dir, e.Name())))
	}
	return c
}

// cniPlugin is what the doctor reads of a plugin's config.
type cniPlugin struct {
	Type       string `json:"type"`
	SubnetFile string `json:"subnetFile"`
	Delegate   struct {
		Bridge string `json:"bridge"`
	} `json:"delegate"`
}

func readCNIFile(path string) doctor.CNIFile {
	f := doctor.CNIFile{Path: path}
	data, err := os.ReadFile(path)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	var conf struct {
		Name    string      `json:"name"`
		Plugins []cniPlugin `json:"plugins"`
		cniPlugin
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		f.Err = err.Error()
		return f
	}
	f.Name = conf.Name
	plugins := conf.Plugins
	if plugins == nil { // a single network config (.conf)
		plugins = []cniPlugin{conf.cniPlugin}
	}
	for _, p := range plugins {
		f.Types = append(f.Types, p.Type)
		if p.Type == "overlay-cni" && !f.HasOverlay {
			f.HasOverlay, f.SubnetFile, f.Bridge = true, p.SubnetFile, p.Delegate.Bridge
		}
	}
	return f
}
