// Package doctor judges whether this host's whole overlay path can carry
// pods' packets, from facts gathered elsewhere (internal/daemon.Diagnose
// reads them from the kernel, the files and the leases, read only):
// forwarding, reverse-path filtering, bridge netfilter where kube-proxy
// runs, FORWARD chains that drop by policy, MTUs along the path, the
// VXLAN port, checksum offload on kernels with the NAT checksum bug, the
// kernel's routes, neighbours and FDB entries against the leases, and
// subnet.env and the CNI config against the lease.
//
// It is pure: each check is one function from Facts to findings, in one
// table (Checks), so each judgement is unit-tested without root and a new
// check is one more entry. `overlayd doctor` prints one line per finding.
package doctor

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/subnet"
)

// Status is a finding's verdict.
type Status string

const (
	// OK: the check passed.
	OK Status = "ok"
	// Problem: something on the path is wrong; Fix says what to do.
	Problem Status = "problem"
	// Note: the check does not apply here, or could not see everything
	// (legacy iptables, say); it does not make the host unclean.
	Note Status = "note"
)

// Finding is one line of the doctor's report.
type Finding struct {
	Check   string `json:"check"`
	Status  Status `json:"status"`
	Subject string `json:"subject,omitempty"` // what it is about: a device, a sysctl, a chain, a file
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"` // what to do, for a problem
}

// Check is one entry of the doctor's table.
type Check struct {
	Name string
	// What says what was checked, for the line of a check that passed.
	What string
	// Judge returns the check's problems and notes; none means it passed.
	Judge func(f *Facts) []Finding
}

// Checks are the doctor's checks, in the order they are reported: the
// host's forwarding first, then the path of a packet outwards, then the
// state overlayd keeps, then what the CNI plugin reads.
var Checks = []Check{
	{"forwarding", "the host forwards the network's families", judgeForwarding},
	{"rp-filter", "reverse-path filtering is off or loose on the underlay and overlay devices", judgeRPFilter},
	{"bridge-netfilter", "bridged pod traffic reaches kube-proxy's rules", judgeBridgeNetfilter},
	{"forward-policy", "no FORWARD chain drops the pod network by policy", judgeForwardPolicy},
	{"mtu", "MTUs agree along the path: underlay, overlay device, subnet.env, bridge, pods", judgeMTU},
	{"vxlan-port", "the VXLAN port is the overlay device's alone", judgePort},
	{"checksum-offload", "no VXLAN checksum offload on a kernel with the NAT checksum bug", judgeChecksum},
	{"kernel-entries", "every route, neighbour and FDB entry matches the leases", judgeEntries},
	{"subnet-env", "subnet.env agrees with the lease", judgeSubnetEnv},
	{"cni-config", "the CNI config directory's overlay conflist reads this subnet.env", judgeCNIConfig},
	{"vxlan-guard", "the VXLAN guard admits exactly the leases' public addresses", judgeGuard},
	{"peer-health", "every peer answers probes through the overlay", judgePeerHealth},
}

// Run judges f with every check and returns the findings in table
// order: a check's problems and notes, or one OK line if it had none.
// Facts a check needed that could not be gathered (Facts.Missing) are a
// problem of that check.
func Run(f *Facts) []Finding {
	var out []Finding
	for _, c := range Checks {
		var got []Finding
		if why, ok := f.Missing[c.Name]; ok {
			got = []Finding{{Status: Problem, Message: "could not read what this check needs: " + why,
				Fix: "run `overlayd doctor` as root on the host (in its network namespace)"}}
		} else {
			got = c.Judge(f)
		}
		if len(got) == 0 {
			got = []Finding{{Status: OK, Message: c.What}}
		}
		for _, g := range got {
			g.Check = c.Name
			out = append(out, g)
		}
	}
	return out
}

// Clean reports whether findings hold no problem.
func Clean(findings []Finding) bool {
	return !slices.ContainsFunc(findings, func(f Finding) bool { return f.Status == Problem })
}

// Facts are what the doctor judges: gathered from the kernel (in the
// host's network namespace), files and the leases, read only.
type Facts struct {
	// Missing names, by check, why facts it needs could not be gathered.
	Missing map[string]string

	// KernelRelease is uname's release, e.g. "6.1.0-18-amd64".
	KernelRelease string

	// The network as stored: its families and networks, the VXLAN port
	// and VNI.
	IPv4, IPv6           bool
	Network, IPv6Network netip.Prefix
	Port, VNI            int
	// Lease is this host's lease as etcd holds it (zero if none names the
	// host: most checks then have nothing to compare against).
	Lease, IPv6Lease netip.Prefix
	HasLease         bool

	// Sysctls by name ("net.ipv4.ip_forward", "net.ipv4.conf.eth0.rp_filter",
	// "net.bridge.bridge-nf-call-iptables" ...); absent: not there.
	Sysctls map[string]string

	Underlay Link   // the underlay interface
	Devices  []Link // the overlay's VXLAN devices, IPv4 first (Missing: not found)
	// Bridge is the CNI bridge (cni0, or the conflist's "bridge"); its
	// Ports are the pods' host-side veths.
	Bridge Link
	Ports  []Link

	// KubeProxy says how kube-proxy was found ("" if not): by its chains in
	// nftables (KUBE-SERVICES, or its own table in nftables mode).
	KubeProxy string

	// ForwardChains are the nftables base chains on the forward hook of
	// every table but overlayd's own; LegacyTables the legacy iptables
	// tables of the namespace (/proc/net/ip_tables_names), whose rules
	// nftables cannot show.
	ForwardChains []Chain
	Chains        map[string]Chain // every chain of the tables above, by "family table chain"
	LegacyTables  []string

	// PortUsers are the other users of the VXLAN port: other VXLAN devices
	// on it and sockets of processes bound to it.
	PortUsers []string

	// Entries are the kernel's routes, neighbours and FDB entries against
	// the leases, per overlay device.
	Entries []Audit

	Env SubnetEnv
	CNI CNIConfig

	// Guard and Health are the VXLAN guard's set and the per-peer health
	// summary; nil when this build or the daemon has none to report.
	Guard  *Guard
	Health *Health
}

// Link is a network device as the doctor sees it.
type Link struct {
	Name      string
	MTU       int
	Missing   bool
	WantMTU   int    // for an overlay device: the MTU its configuration gives it
	TxCsum    bool   // for an overlay device: transmit checksum offload is on
	TxCsumErr string // why TxCsum could not be read
	Family    string // for an overlay device: IPv4 or IPv6
}

// Chain is an nftables chain as far as accepting the pod network goes.
type Chain struct {
	Family, Table, Name string
	Policy              string // "drop", "accept"; "" for a regular chain
	Rules               []Rule
}

// ID is the chain as nft names it: "ip filter FORWARD".
func (c Chain) ID() string { return c.Family + " " + c.Table + " " + c.Name }

// Rule is one rule of a chain, reduced to its address matches and its
// verdict.
type Rule struct {
	Src, Dst netip.Prefix // zero: the rule does not match on it
	IIf, OIf string       // input and output interface ("" any; "name+" a prefix)
	Other    bool         // the rule matches on something else too (conntrack, marks, sets ...)
	Verdict  string       // "accept", "drop", "jump", "goto", "return" or "" (none)
	Target   string       // the chain of a jump or goto
}

// Audit is one overlay device's kernel state against the leases.
type Audit struct {
	Device        string
	Missing       bool
	DeviceProblem string
	Drift         []Drift
	Conflicts     []netip.Prefix
	Rejected      map[string]string
}

// Drift is one entry that differs from the leases.
type Drift struct {
	Kind  string // route, neighbour, fdb
	Peer  netip.Prefix
	Stale bool
	Entry string
}

// SubnetEnv is subnet.env as read.
type SubnetEnv struct {
	Path                    string
	Err                     string // why it could not be read ("" if it was)
	Missing                 bool
	Network, Subnet         netip.Prefix // OVERLAY_NETWORK, and the lease OVERLAY_SUBNET names
	IPv6Network, IPv6Subnet netip.Prefix
	MTU                     int
}

// CNIConfig is the CNI config directory as read.
type CNIConfig struct {
	Dir   string
	Err   string
	Files []CNIFile
}

// CNIFile is one network config (list) of the directory.
type CNIFile struct {
	Path       string
	Name       string   // the network name
	Types      []string // the plugins' types, in order
	SubnetFile string   // overlay-cni's subnetFile ("" if it has none)
	HasOverlay bool     // a plugin is overlay-cni
	Bridge     string   // overlay-cni's delegate's bridge ("" for the bridge plugin's default, cni0)
	// SameSubnetFile says that SubnetFile (or overlay-cni's default) names
	// the very file subnet.env is, by another path (/var/run is /run).
	SameSubnetFile bool
	Err            string
}

// Guard is the VXLAN guard's admitted addresses and what the leases want.
type Guard struct {
	Enabled bool
	// Admitted and Want, per family ("ip", "ip6"): the set's elements and
	// the valid leases' public addresses.
	Admitted, Want map[string][]netip.Addr
}

// Health is the daemon's per-peer health summary.
type Health struct {
	Reachable   int
	Unreachable []PeerHealth
}

// PeerHealth is one unreachable peer.
type PeerHealth struct {
	Peer  string // subnet and public address
	Since string
	Loss  int // consecutive losses
}

// sysctl returns a sysctl's value and whether it is there.
func (f *Facts) sysctl(name string) (string, bool) {
	v, ok := f.Sysctls[name]
	return strings.TrimSpace(v), ok
}

func judgeForwarding(f *Facts) []Finding {
	var out []Finding
	for _, s := range []struct {
		on   bool
		name string
	}{{f.IPv4, "net.ipv4.ip_forward"}, {f.IPv6, "net.ipv6.conf.all.forwarding"}} {
		if !s.on {
			continue
		}
		if v, ok := f.sysctl(s.name); !ok || v != "1" {
			out = append(out, Finding{Status: Problem, Subject: s.name,
				Message: fmt.Sprintf("%s is %s: the host drops pod traffic between the bridge and the overlay device", s.name, orMissing(v, ok)),
				Fix:     fmt.Sprintf("sysctl -w %s=1, and set it in /etc/sysctl.d/ to keep it", s.name)})
		}
	}
	return out
}

func orMissing(v string, ok bool) string {
	if !ok {
		return "missing"
	}
	return v
}

// judgeRPFilter: the kernel filters by the higher of conf.all and
// conf.<dev>; 1 (strict) drops a packet that arrives on another interface
// than the one its source is routed by, which asymmetric overlay paths
// (DirectRouting one way, VXLAN the other; several underlay links) do.
// 0 (off) and 2 (loose) are fine. rp_filter is IPv4 only.
func judgeRPFilter(f *Facts) []Finding {
	if !f.IPv4 {
		return nil
	}
	all, _ := f.sysctl("net.ipv4.conf.all.rp_filter")
	var out []Finding
	devs := []string{f.Underlay.Name}
	for _, d := range f.Devices {
		if d.Family != "IPv6" && !d.Missing {
			devs = append(devs, d.Name)
		}
	}
	for _, dev := range devs {
		if dev == "" {
			continue
		}
		v, ok := f.sysctl("net.ipv4.conf." + dev + ".rp_filter")
		if !ok {
			continue
		}
		eff := max(atoi(all), atoi(v))
		if eff != 1 {
			continue
		}
		fix := fmt.Sprintf("sysctl -w net.ipv4.conf.%s.rp_filter=2 (loose; 0, off, is fine too)", dev)
		if atoi(all) == 1 {
			fix = fmt.Sprintf("sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.%s.rp_filter=2 (the kernel uses the higher of all and the device's; 0, off, is fine too)", dev)
		}
		out = append(out, Finding{Status: Problem, Subject: dev,
			Message: fmt.Sprintf("strict reverse-path filtering on %s (rp_filter: all=%s, %s=%s): packets of asymmetric overlay paths are dropped", dev, orMissing(all, all != ""), dev, v),
			Fix:     fix + ", and set it in /etc/sysctl.d/ to keep it"})
	}
	return out
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

// judgeBridgeNetfilter: where kube-proxy runs, packets between two pods
// on one bridge (a pod reaching a Service whose endpoint is on the same
// host) must pass the IP hooks, or its DNAT is never undone on the way
// back.
func judgeBridgeNetfilter(f *Facts) []Finding {
	if f.KubeProxy == "" {
		return []Finding{{Status: Note, Message: "kube-proxy not found here (no KUBE-SERVICES chain and no kube-proxy table in nftables; legacy iptables is not looked at): bridge netfilter is not needed"}}
	}
	var out []Finding
	for _, s := range []struct {
		on   bool
		name string
	}{{f.IPv4, "net.bridge.bridge-nf-call-iptables"}, {f.IPv6, "net.bridge.bridge-nf-call-ip6tables"}} {
		if !s.on {
			continue
		}
		v, ok := f.sysctl(s.name)
		switch {
		case !ok:
			out = append(out, Finding{Status: Problem, Subject: "br_netfilter",
				Message: fmt.Sprintf("kube-proxy runs here (%s) but br_netfilter is not loaded (no %s): a pod's traffic to a Service whose endpoint is on this host's bridge is not un-NATed", f.KubeProxy, s.name),
				Fix:     "modprobe br_netfilter, list it in /etc/modules-load.d/, then sysctl -w " + s.name + "=1"})
		case v != "1":
			out = append(out, Finding{Status: Problem, Subject: s.name,
				Message: fmt.Sprintf("kube-proxy runs here (%s) but %s is %s: bridged pod traffic skips its rules", f.KubeProxy, s.name, v),
				Fix:     "sysctl -w " + s.name + "=1, and set it in /etc/sysctl.d/ to keep it"})
		}
	}
	return out
}

// judgeForwardPolicy: in nftables every base chain on the forward hook
// sees the packet and a drop in any wins, so each chain with policy drop
// must itself accept pod-to-pod traffic between hosts, both ways: a local
// pod's packet to another host's pod (in on the bridge, out on the
// overlay device) and the answer (in on the overlay device, out on the
// bridge), source and destination both in the pod network.
func judgeForwardPolicy(f *Facts) []Finding {
	var out []Finding
	bridge := cmpOr(f.Bridge.Name, "cni0")
	for _, ch := range f.ForwardChains {
		if ch.Policy != "drop" {
			continue
		}
		for _, n := range []struct {
			on         bool
			fam, which string
			net        netip.Prefix
		}{{f.IPv4, "ip", "IPv4", f.Network}, {f.IPv6, "ip6", "IPv6", f.IPv6Network}} {
			if !n.on || !n.net.IsValid() || ch.Family != "inet" && ch.Family != n.fam {
				continue
			}
			dev := ""
			for _, d := range f.Devices {
				if d.Family == n.which {
					dev = d.Name
				}
			}
			out1 := packet{net: n.net, in: bridge, out: dev}
			back := packet{net: n.net, in: dev, out: bridge}
			var missing []string
			if v, _ := f.sysctl("net.bridge.bridge-nf-call-" + map[string]string{"ip": "iptables", "ip6": "ip6tables"}[n.fam]); v == "1" &&
				!accepts(f.Chains, ch, packet{net: n.net, in: bridge, out: bridge}, 0) {
				missing = append(missing, fmt.Sprintf("between this host's own pods (in %s, out %[1]s: bridge netfilter passes them through the forward hook)", bridge))
			}
			if !accepts(f.Chains, ch, out1, 0) {
				missing = append(missing, fmt.Sprintf("from this host's pods to other hosts' (in %s, out %s)", bridge, dev))
			}
			if !accepts(f.Chains, ch, back, 0) {
				missing = append(missing, fmt.Sprintf("from other hosts' pods to this host's (in %s, out %s)", dev, bridge))
			}
			if len(missing) == 0 {
				continue
			}
			out = append(out, Finding{Status: Problem, Subject: ch.ID(),
				Message: fmt.Sprintf("chain %s has policy drop and accepts no traffic of the pod network %s %s: such packets are dropped", ch.ID(), n.net, strings.Join(missing, ", nor ")),
				Fix:     acceptFix(ch, n.fam, n.net)})
		}
	}
	if len(f.LegacyTables) > 0 {
		out = append(out, Finding{Status: Note, Subject: "iptables-legacy",
			Message: fmt.Sprintf("legacy iptables tables exist (%s): nftables cannot show their rules, so a FORWARD drop there is not seen", strings.Join(f.LegacyTables, ", ")),
			Fix:     "check `iptables-legacy -S FORWARD` (and ip6tables-legacy) for a DROP policy without ACCEPT rules for the pod network"})
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func acceptFix(ch Chain, fam string, n netip.Prefix) string {
	if fam == "ip" && ch.Table == "filter" && ch.Name == "FORWARD" {
		return fmt.Sprintf("accept it in that chain, e.g. `iptables -I FORWARD -s %[1]s -j ACCEPT; iptables -I FORWARD -d %[1]s -j ACCEPT` (with Docker: in chain DOCKER-USER instead of FORWARD)", n)
	}
	if fam == "ip6" && ch.Table == "filter" && ch.Name == "FORWARD" {
		return fmt.Sprintf("accept it in that chain, e.g. `ip6tables -I FORWARD -s %[1]s -j ACCEPT; ip6tables -I FORWARD -d %[1]s -j ACCEPT`", n)
	}
	return fmt.Sprintf("accept it in that chain, e.g. `nft insert rule %[1]s %[2]s saddr %[3]s accept; nft insert rule %[1]s %[2]s daddr %[3]s accept`", ch.ID(), fam, n)
}

// packet is a forwarded pod-to-pod packet between hosts: source and
// destination in net, in and out by these interfaces.
type packet struct {
	net     netip.Prefix
	in, out string
}

// matches says whether every condition of r that the doctor reads holds
// for p (known), and whether r also has conditions it cannot judge
// (conntrack, marks, sets ...).
func (r Rule) matches(p packet) (known, unknown bool) {
	known = (!r.Src.IsValid() || covers(r.Src, p.net)) && (!r.Dst.IsValid() || covers(r.Dst, p.net)) &&
		ifaceIs(r.IIf, p.in) && ifaceIs(r.OIf, p.out)
	return known, r.Other
}

// ifaceIs says whether a rule's interface match (name, "prefix+" as
// iptables writes a wildcard, "" none) holds for name.
func ifaceIs(match, name string) bool {
	if match == "" {
		return true
	}
	if pre, ok := strings.CutSuffix(match, "+"); ok {
		return strings.HasPrefix(name, pre)
	}
	return match == name
}

// accepts reports whether chain ch, a base chain with policy drop,
// accepts packet p.
func accepts(chains map[string]Chain, ch Chain, p packet, depth int) bool {
	return verdictFor(chains, ch, p, depth) == "accept"
}

// verdictFor is what chain ch does with packet p: "accept" or "drop" from
// the first rule whose conditions all hold for p, or "" when p falls off
// its end or returns (the caller goes on; a base chain applies its
// policy). Jumps and gotos under such conditions are followed. A rule
// with a condition the doctor cannot judge (ct state, a mark) decides
// nothing here: "ct state established accept" lets no new connection
// through, and a drop under such a condition is not assumed to apply.
func verdictFor(chains map[string]Chain, ch Chain, p packet, depth int) string {
	if depth > 16 {
		return ""
	}
	for _, r := range ch.Rules {
		known, unknown := r.matches(p)
		if !known || unknown {
			continue
		}
		switch r.Verdict {
		case "accept", "drop":
			return r.Verdict
		case "return":
			return ""
		case "jump", "goto":
			sub, ok := chains[ch.Family+" "+ch.Table+" "+r.Target]
			if !ok {
				continue
			}
			if v := verdictFor(chains, sub, p, depth+1); v != "" || r.Verdict == "goto" {
				return v
			}
		}
	}
	return ""
}

// covers reports whether p holds all of n.
func covers(p, n netip.Prefix) bool { return p.Bits() <= n.Bits() && p.Contains(n.Addr()) }

// judgeMTU: the overlay device must have the MTU its configuration gives
// it (underlay minus the VXLAN overhead, or Backend.MTU), subnet.env
// must hand pods that (the smallest device's), and neither the bridge nor
// a pod's veth may be larger: a packet above the overlay's MTU leaving a
// pod is dropped, and path MTU discovery across the tunnel is not
// reliable.
func judgeMTU(f *Facts) []Finding {
	var out []Finding
	podMTU := 0
	for _, d := range f.Devices {
		if d.Missing {
			continue
		}
		if d.WantMTU > 0 && d.MTU != d.WantMTU {
			out = append(out, Finding{Status: Problem, Subject: d.Name,
				Message: fmt.Sprintf("%s has MTU %d, want %d (underlay %s MTU %d minus the VXLAN overhead, or Backend.MTU)", d.Name, d.MTU, d.WantMTU, f.Underlay.Name, f.Underlay.MTU),
				Fix:     "restart overlayd (it sets the device's MTU); if the underlay's MTU changed, recreate the pods afterwards"})
		}
		if podMTU == 0 || d.MTU < podMTU {
			podMTU = d.MTU
		}
	}
	if podMTU == 0 {
		return out
	}
	if f.Env.Err == "" && f.Env.MTU != 0 && f.Env.MTU != podMTU {
		out = append(out, Finding{Status: Problem, Subject: f.Env.Path,
			Message: fmt.Sprintf("subnet.env gives pods MTU %d, the overlay device has %d", f.Env.MTU, podMTU),
			Fix:     "restart overlayd to rewrite subnet.env, then recreate the pods so they get the new MTU"})
	}
	if !f.Bridge.Missing && f.Bridge.Name != "" && f.Bridge.MTU > podMTU {
		out = append(out, Finding{Status: Problem, Subject: f.Bridge.Name,
			Message: fmt.Sprintf("bridge %s has MTU %d, above the overlay's %d: pods' large packets to other hosts are dropped", f.Bridge.Name, f.Bridge.MTU, podMTU),
			Fix:     fmt.Sprintf("ip link set %s mtu %d, and recreate the pods whose veths are larger", f.Bridge.Name, podMTU)})
	}
	for _, p := range f.Ports {
		if p.MTU > podMTU {
			out = append(out, Finding{Status: Problem, Subject: p.Name,
				Message: fmt.Sprintf("pod veth %s on %s has MTU %d, above the overlay's %d: that pod's large packets to other hosts are dropped", p.Name, f.Bridge.Name, p.MTU, podMTU),
				Fix:     "recreate the pod (it gets OVERLAY_MTU from subnet.env), or set the MTU of both ends of its veth to " + strconv.Itoa(podMTU)})
		}
	}
	return out
}

func judgePort(f *Facts) []Finding {
	var out []Finding
	for _, u := range f.PortUsers {
		out = append(out, Finding{Status: Problem, Subject: "udp/" + strconv.Itoa(f.Port),
			Message: fmt.Sprintf("UDP port %d is also used by %s: the overlay device cannot receive on it, or shares it", f.Port, u),
			Fix:     "stop or delete it, or give the network another Backend.Port; see `ss -ulpn` and `ip -d link show type vxlan`"})
	}
	return out
}

// ChecksumFixedIn is the first kernel release whose NAT does not corrupt
// the UDP checksum of VXLAN packets (sent with a zero checksum, or with
// transmit checksum offload) when their outer header is NATed a second
// time — kube-proxy's MASQUERADE --random-fully on packets still carrying
// its mark after encapsulation. The receiver drops them and TCP through
// Services stalls for 63 s (flannel issue 1279, Calico issue 3145).
// flannel turned the offload off on its device (flannel PR 1282) and
// later documented `ethtool -K flannel.1 tx-checksum-ip-generic off`;
// Calico felix turns it off on kernels before 5.7 (felix PR 2811), the
// boundary used here; Kubernetes 1.16.13, 1.17.9 and 1.18.6 stopped the
// double NAT on kube-proxy's side.
var ChecksumFixedIn = [2]int{5, 7}

func judgeChecksum(f *Facts) []Finding {
	major, minor, ok := kernelVersion(f.KernelRelease)
	if !ok {
		return []Finding{{Status: Note, Subject: "kernel", Message: fmt.Sprintf("kernel release %q not understood: cannot tell whether it has the VXLAN NAT checksum bug (fixed in 5.7)", f.KernelRelease)}}
	}
	if major > ChecksumFixedIn[0] || major == ChecksumFixedIn[0] && minor >= ChecksumFixedIn[1] {
		return nil
	}
	var out []Finding
	for _, d := range f.Devices {
		switch {
		case d.Missing:
		case d.TxCsumErr != "":
			out = append(out, Finding{Status: Note, Subject: d.Name, Message: "cannot read the checksum offload of " + d.Name + ": " + d.TxCsumErr})
		case d.TxCsum:
			out = append(out, Finding{Status: Problem, Subject: d.Name,
				Message: fmt.Sprintf("kernel %s (before 5.7) miscomputes the UDP checksum of NATed VXLAN packets, and %s has transmit checksum offload on: traffic through Services may stall", f.KernelRelease, d.Name),
				Fix:     fmt.Sprintf("ethtool -K %s tx-checksum-ip-generic off (again whenever the device is recreated), or upgrade the kernel", d.Name)})
		}
	}
	return out
}

// kernelVersion is the major and minor number of a release like
// "5.4.0-150-generic".
func kernelVersion(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	end := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(parts[1])
	}
	minor, err2 := strconv.Atoi(parts[1][:end])
	return major, minor, err1 == nil && err2 == nil
}

func judgeEntries(f *Facts) []Finding {
	if !f.HasLease {
		return []Finding{{Status: Problem, Subject: "lease", Message: "no lease in etcd names this host (by node name or public address): its peers have no route to it",
			Fix: "start overlayd (`overlayd run`), or check --node-name, --public-ip and --prefix; `overlayd lease list` shows the leases"}}
	}
	var out []Finding
	for _, a := range f.Entries {
		if a.Missing {
			out = append(out, Finding{Status: Problem, Subject: a.Device, Message: "device " + a.Device + " does not exist", Fix: "start overlayd (it creates the device); `journalctl -u overlayd` says why it did not"})
			continue
		}
		if a.DeviceProblem != "" {
			out = append(out, Finding{Status: Problem, Subject: a.Device, Message: a.Device + " differs from its configuration: " + a.DeviceProblem, Fix: "restart overlayd: it fixes or recreates the device"})
		}
		for _, d := range a.Drift {
			msg := fmt.Sprintf("%s: %s %s is missing or different (for the peer %s)", a.Device, d.Kind, d.Entry, d.Peer)
			if d.Stale {
				msg = fmt.Sprintf("%s: stale %s %s (no lease wants it)", a.Device, d.Kind, d.Entry)
			}
			out = append(out, Finding{Status: Problem, Subject: a.Device, Message: msg,
				Fix: "a running overlayd repairs it within --kernel-resync; if it stays, another program keeps changing it (see overlay_drift_repairs_total), or overlayd is not running"})
		}
		for _, c := range a.Conflicts {
			out = append(out, Finding{Status: Problem, Subject: a.Device, Message: fmt.Sprintf("another program's route holds the peer subnet %s: that peer is unreachable", c),
				Fix: fmt.Sprintf("find it with `ip route show %s` and remove it", c)})
		}
		keys := make([]string, 0, len(a.Rejected))
		for k := range a.Rejected {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, Finding{Status: Problem, Subject: a.Device, Message: fmt.Sprintf("lease %s is not programmed: %s", k, a.Rejected[k]),
				Fix: "fix or revoke the lease (`overlayd lease list` shows the owners)"})
		}
	}
	return out
}

func judgeSubnetEnv(f *Facts) []Finding {
	e := f.Env
	switch {
	case e.Missing:
		return []Finding{{Status: Problem, Subject: e.Path, Message: e.Path + " does not exist: overlay-cni cannot add pods", Fix: "start overlayd (it writes it), or pass --subnet-file as overlayd run has it"}}
	case e.Err != "":
		return []Finding{{Status: Problem, Subject: e.Path, Message: "cannot read " + e.Path + ": " + e.Err, Fix: "restart overlayd to rewrite it"}}
	case !f.HasLease:
		return nil // judgeEntries says so
	}
	var out []Finding
	bad := func(what string, have, want any) {
		out = append(out, Finding{Status: Problem, Subject: e.Path,
			Message: fmt.Sprintf("%s in %s is %v, the lease says %v: new pods get addresses of the wrong subnet", what, e.Path, have, want),
			Fix:     "restart overlayd to rewrite it (pods created since may need to be recreated)"})
	}
	if f.IPv4 {
		if e.Subnet != f.Lease {
			bad("the subnet", orNone(e.Subnet), f.Lease)
		}
		if e.Network != f.Network {
			bad("the network", orNone(e.Network), f.Network)
		}
	}
	if f.IPv6 {
		if e.IPv6Subnet != f.IPv6Lease {
			bad("the IPv6 subnet", orNone(e.IPv6Subnet), f.IPv6Lease)
		}
		if e.IPv6Network != f.IPv6Network {
			bad("the IPv6 network", orNone(e.IPv6Network), f.IPv6Network)
		}
	}
	return out
}

func orNone(p netip.Prefix) string {
	if !p.IsValid() {
		return "missing"
	}
	return p.String()
}

// judgeCNIConfig: the runtime uses the first config of the directory (in
// name order); it must be overlay-cni's, reading this subnet.env.
func judgeCNIConfig(f *Facts) []Finding {
	c := f.CNI
	if c.Err != "" {
		return []Finding{{Status: Problem, Subject: c.Dir, Message: "cannot read the CNI config directory " + c.Dir + ": " + c.Err,
			Fix: "install the conflist with `overlayd install-cni`, or pass --cni-conf-dir"}}
	}
	if len(c.Files) == 0 {
		return []Finding{{Status: Problem, Subject: c.Dir, Message: "no CNI network config in " + c.Dir + ": the runtime cannot attach pods",
			Fix: "install the conflist with `overlayd install-cni`, or pass --cni-conf-dir"}}
	}
	first := c.Files[0]
	switch {
	case first.Err != "":
		return []Finding{{Status: Problem, Subject: first.Path, Message: "the runtime's CNI config " + first.Path + " does not parse: " + first.Err,
			Fix: "fix or remove it; `overlayd install-cni` writes a good one"}}
	case !first.HasOverlay:
		idx := slices.IndexFunc(c.Files, func(x CNIFile) bool { return x.HasOverlay })
		msg := fmt.Sprintf("the runtime uses %s (network %q, plugins %s), the first config in %s, and it is not overlay's", first.Path, first.Name, strings.Join(first.Types, ","), c.Dir)
		if idx > 0 {
			msg += fmt.Sprintf(" (%s is, but comes later)", c.Files[idx].Path)
		}
		return []Finding{{Status: Problem, Subject: first.Path, Message: msg, Fix: "remove or rename it so overlay's conflist sorts first"}}
	}
	want := f.Env.Path
	have := first.SubnetFile
	if have == "" {
		have = subnet.DefaultEnvFile // overlay-cni's default
	}
	if want != "" && have != want && !first.SameSubnetFile {
		return []Finding{{Status: Problem, Subject: first.Path,
			Message: fmt.Sprintf("%s has overlay-cni read %s, but overlayd writes %s", first.Path, have, want),
			Fix:     fmt.Sprintf("set \"subnetFile\": %q in it, or run overlayd with --subnet-file=%s", want, have)}}
	}
	return nil
}

// judgeGuard: the VXLAN guard's set must hold exactly the valid leases'
// public addresses (of overlay and flanneld hosts alike), or a peer's
// packets are dropped (missing) or a gone host's admitted (extra).
func judgeGuard(f *Facts) []Finding {
	if f.Guard == nil {
		return []Finding{{Status: Note, Message: "this overlayd has no VXLAN guard to check"}}
	}
	if !f.Guard.Enabled {
		return []Finding{{Status: Note, Message: "the VXLAN guard is not in place (overlayd runs with --vxlan-guard=false, or has not started): anyone reaching the VXLAN port can inject packets"}}
	}
	var out []Finding
	for _, fam := range []string{"ip", "ip6"} {
		have := map[netip.Addr]bool{}
		for _, a := range f.Guard.Admitted[fam] {
			have[a] = true
		}
		want := map[netip.Addr]bool{}
		for _, a := range f.Guard.Want[fam] {
			want[a] = true
			if !have[a] {
				out = append(out, Finding{Status: Problem, Subject: a.String(), Message: fmt.Sprintf("the VXLAN guard does not admit %s, the public address of a lease: its pods' packets are dropped", a),
					Fix: "a running overlayd adds it within --kernel-resync; restart overlayd if it stays"})
			}
		}
		for _, a := range f.Guard.Admitted[fam] {
			if !want[a] {
				out = append(out, Finding{Status: Problem, Subject: a.String(), Message: fmt.Sprintf("the VXLAN guard admits %s, which no valid lease has", a),
					Fix: "a running overlayd removes it within --kernel-resync; restart overlayd if it stays"})
			}
		}
	}
	return out
}

func judgePeerHealth(f *Facts) []Finding {
	if f.Health == nil {
		return []Finding{{Status: Note, Message: "no per-peer health to report (the daemon does not probe peers, or was not reached)"}}
	}
	var out []Finding
	for _, p := range f.Health.Unreachable {
		out = append(out, Finding{Status: Problem, Subject: p.Peer,
			Message: fmt.Sprintf("peer %s is unreachable through the overlay since %s (%d probes lost in a row)", p.Peer, p.Since, p.Loss),
			Fix:     "check the underlay between the hosts (UDP to the VXLAN port), the peer's overlayd, and the MTU; run `overlayd doctor` on the peer"})
	}
	return out
}
