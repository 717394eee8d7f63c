package doctor

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

var (
	network = netip.MustParsePrefix("10.244.0.0/16")
	lease   = netip.MustParsePrefix("10.244.7.0/24")
)

// healthy is a host every check passes on (guard and health aside, which
// have nothing to report).
func healthy() *Facts {
	return &Facts{
		KernelRelease: "6.1.0-18-amd64",
		IPv4:          true, Network: network, Port: 8472, VNI: 1,
		Lease: lease, HasLease: true,
		Sysctls: map[string]string{
			"net.ipv4.ip_forward":                "1",
			"net.ipv4.conf.all.rp_filter":        "0",
			"net.ipv4.conf.eth0.rp_filter":       "2",
			"net.ipv4.conf.overlay.1.rp_filter":  "0",
			"net.bridge.bridge-nf-call-iptables": "1",
		},
		Underlay: Link{Name: "eth0", MTU: 1500},
		Devices:  []Link{{Name: "overlay.1", MTU: 1450, WantMTU: 1450, TxCsum: true, Family: "IPv4"}},
		Bridge:   Link{Name: "cni0", MTU: 1450},
		Ports:    []Link{{Name: "veth1", MTU: 1450}},
		Entries:  []Audit{{Device: "overlay.1"}},
		Env:      SubnetEnv{Path: "/run/overlay/subnet.env", Network: network, Subnet: lease, MTU: 1450},
		CNI: CNIConfig{Dir: "/etc/cni/net.d", Files: []CNIFile{
			{Path: "/etc/cni/net.d/10-overlay.conflist", Name: "overlay", Types: []string{"overlay-cni", "portmap"}, HasOverlay: true},
		}},
	}
}

func problemsOf(fs []Finding, check string) []Finding {
	return slices.DeleteFunc(slices.Clone(fs), func(f Finding) bool { return f.Check != check || f.Status != Problem })
}

func TestAHealthyHostIsClean(t *testing.T) {
	fs := Run(healthy())
	if !Clean(fs) {
		t.Fatalf("findings of a healthy host: %+v", fs)
	}
	for _, c := range Checks {
		if !slices.ContainsFunc(fs, func(f Finding) bool { return f.Check == c.Name }) {
			t.Errorf("no line for check %s", c.Name)
		}
	}
}

// Each case breaks one fact of a healthy host: exactly its check reports
// a problem, whose message and fix name what the operator needs.
func TestEachCheckFindsItsProblem(t *testing.T) {
	for _, tc := range []struct {
		name, check string
		breakIt     func(f *Facts)
		want        []string // in the message or fix
	}{
		{"forwarding off", "forwarding", func(f *Facts) { f.Sysctls["net.ipv4.ip_forward"] = "0" }, []string{"net.ipv4.ip_forward is 0", "sysctl -w net.ipv4.ip_forward=1"}},
		{"IPv6 forwarding off in a dual-stack network", "forwarding", func(f *Facts) { f.IPv6 = true; f.Sysctls["net.ipv6.conf.all.forwarding"] = "0" }, []string{"net.ipv6.conf.all.forwarding"}},
		{"strict rp_filter on the underlay", "rp-filter", func(f *Facts) { f.Sysctls["net.ipv4.conf.eth0.rp_filter"] = "1" }, []string{"strict", "eth0", "rp_filter=2"}},
		{"strict rp_filter in all wins over loose on the device", "rp-filter", func(f *Facts) { f.Sysctls["net.ipv4.conf.all.rp_filter"] = "1" }, []string{"net.ipv4.conf.all.rp_filter=2", "overlay.1"}},
		{"kube-proxy without br_netfilter", "bridge-netfilter", func(f *Facts) {
			f.KubeProxy = "nftables chain ip nat KUBE-SERVICES"
			delete(f.Sysctls, "net.bridge.bridge-nf-call-iptables")
		}, []string{"br_netfilter is not loaded", "modprobe br_netfilter"}},
		{"kube-proxy with bridge-nf-call-iptables off", "bridge-netfilter", func(f *Facts) {
			f.KubeProxy = "nftables chain ip nat KUBE-SERVICES"
			f.Sysctls["net.bridge.bridge-nf-call-iptables"] = "0"
		}, []string{"bridge-nf-call-iptables is 0", "=1"}},
		{"Docker's FORWARD drop", "forward-policy", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{Verdict: "jump", Target: "DOCKER-USER"}}}}
			f.Chains = map[string]Chain{"ip filter DOCKER-USER": {Family: "ip", Table: "filter", Name: "DOCKER-USER", Rules: []Rule{{Verdict: "return"}}}}
		}, []string{"ip filter FORWARD", "pod network 10.244.0.0/16 between this host's own pods", "from this host's pods to other hosts' (in cni0, out overlay.1), nor from other hosts' pods to this host's (in overlay.1, out cni0): such packets are dropped", "DOCKER-USER"}},
		{"drop chain accepting pods' traffic out only, and established answers", "forward-policy", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "inet", Table: "fw", Name: "fwd", Policy: "drop", Rules: []Rule{{Other: true, Verdict: "accept"}, {IIf: "cni0", Verdict: "accept"}}}}
		}, []string{"inet fw fwd", "from other hosts' pods to this host's (in overlay.1, out cni0)", "nft insert rule inet fw fwd ip saddr 10.244.0.0/16 accept"}},
		{"bridged pod-to-pod traffic through the forward hook", "forward-policy", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{IIf: "cni0", OIf: "overlay.1", Verdict: "accept"}, {IIf: "overlay.1", OIf: "cni0", Verdict: "accept"}}}}
		}, []string{"between this host's own pods (in cni0, out cni0"}},
		{"a drop in a jumped-to chain is final", "forward-policy", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{Verdict: "jump", Target: "ISOLATION"}, {Src: network, Verdict: "accept"}}}}
			f.Chains = map[string]Chain{"ip filter ISOLATION": {Family: "ip", Table: "filter", Name: "ISOLATION", Rules: []Rule{{OIf: "overlay.1", Verdict: "drop"}}}}
		}, []string{"from this host's pods to other hosts'"}},
		{"device MTU off", "mtu", func(f *Facts) { f.Devices[0].MTU = 1400 }, []string{"overlay.1 has MTU 1400, want 1450"}},
		{"subnet.env MTU off", "mtu", func(f *Facts) { f.Env.MTU = 1500 }, []string{"gives pods MTU 1500"}},
		{"veth larger than the overlay", "mtu", func(f *Facts) { f.Ports[0].MTU = 1500 }, []string{"veth1", "1500", "above the overlay's 1450"}},
		{"bridge larger than the overlay", "mtu", func(f *Facts) { f.Bridge.MTU = 9000 }, []string{"bridge cni0 has MTU 9000"}},
		{"port shared", "vxlan-port", func(f *Facts) { f.PortUsers = []string{"a socket on 0.0.0.0:8472 of nc (pid 42)"} }, []string{"UDP port 8472", "nc (pid 42)"}},
		{"old kernel with offload", "checksum-offload", func(f *Facts) { f.KernelRelease = "5.4.0-150-generic" }, []string{"5.4.0-150-generic", "ethtool -K overlay.1 tx-checksum-ip-generic off"}},
		{"no lease", "kernel-entries", func(f *Facts) { f.HasLease = false }, []string{"no lease in etcd names this host"}},
		{"device missing", "kernel-entries", func(f *Facts) { f.Entries[0].Missing = true }, []string{"overlay.1 does not exist"}},
		{"route missing", "kernel-entries", func(f *Facts) {
			f.Entries[0].Drift = []Drift{{Kind: "route", Peer: netip.MustParsePrefix("10.244.9.0/24"), Entry: "10.244.9.0/24 via 10.244.9.0 dev 5 onlink"}}
		}, []string{"route 10.244.9.0/24 via 10.244.9.0", "missing or different", "10.244.9.0/24"}},
		{"stale neighbour", "kernel-entries", func(f *Facts) {
			f.Entries[0].Drift = []Drift{{Kind: "neighbour", Stale: true, Entry: "10.244.99.0 lladdr 0e:00:00:00:00:01"}}
		}, []string{"stale neighbour 10.244.99.0"}},
		{"conflicting route", "kernel-entries", func(f *Facts) { f.Entries[0].Conflicts = []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")} }, []string{"another program's route holds the peer subnet 10.244.9.0/24"}},
		{"subnet.env missing", "subnet-env", func(f *Facts) { f.Env.Missing = true }, []string{"does not exist"}},
		{"subnet.env of another lease", "subnet-env", func(f *Facts) { f.Env.Subnet = netip.MustParsePrefix("10.244.8.0/24") }, []string{"10.244.8.0/24", "the lease says 10.244.7.0/24"}},
		{"no CNI config", "cni-config", func(f *Facts) { f.CNI.Files = nil }, []string{"no CNI network config in /etc/cni/net.d"}},
		{"another config first", "cni-config", func(f *Facts) {
			f.CNI.Files = append([]CNIFile{{Path: "/etc/cni/net.d/05-bridge.conf", Name: "mynet", Types: []string{"bridge"}}}, f.CNI.Files...)
		}, []string{"05-bridge.conf", "not overlay's", "10-overlay.conflist is, but comes later"}},
		{"conflist reads another subnet.env", "cni-config", func(f *Facts) { f.CNI.Files[0].SubnetFile = "/run/flannel/subnet.env" }, []string{"/run/flannel/subnet.env", "--subnet-file"}},
		{"guard misses a peer", "vxlan-guard", func(f *Facts) {
			f.Guard = &Guard{Enabled: true, Want: map[string][]netip.Addr{"ip": {netip.MustParseAddr("198.18.0.2")}}}
		}, []string{"does not admit 198.18.0.2"}},
		{"guard admits a gone host", "vxlan-guard", func(f *Facts) {
			f.Guard = &Guard{Enabled: true, Admitted: map[string][]netip.Addr{"ip": {netip.MustParseAddr("198.18.0.9")}}}
		}, []string{"admits 198.18.0.9"}},
		{"unreachable peer", "peer-health", func(f *Facts) {
			f.Health = &Health{Unreachable: []PeerHealth{{Peer: "10.244.9.0/24 198.18.0.9", Since: "2026-11-27T10:00:00Z", Loss: 7}}}
		}, []string{"10.244.9.0/24 198.18.0.9", "unreachable", "7 probes"}},
		{"facts missing", "mtu", func(f *Facts) { f.Missing = map[string]string{"mtu": "open netlink: permission denied"} }, []string{"permission denied", "as root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.breakIt(f)
			fs := Run(f)
			got := problemsOf(fs, tc.check)
			if len(got) == 0 {
				t.Fatalf("no problem from %s: %+v", tc.check, fs)
			}
			if others := slices.DeleteFunc(slices.Clone(fs), func(f Finding) bool { return f.Status != Problem || f.Check == tc.check }); len(others) > 0 {
				t.Errorf("other checks report problems too: %+v", others)
			}
			text := got[0].Message + " / " + got[0].Fix
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s: %q does not say %q", tc.check, text, w)
				}
			}
			if got[0].Fix == "" {
				t.Errorf("%s: no fix in %+v", tc.check, got[0])
			}
			if Clean(fs) {
				t.Error("Clean with a problem")
			}
		})
	}
}

// The fine values and cases that must not be reported.
func TestWhatIsFineIsNotReported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *Facts)
	}{
		{"rp_filter loose everywhere", func(f *Facts) {
			f.Sysctls["net.ipv4.conf.all.rp_filter"] = "2"
			f.Sysctls["net.ipv4.conf.eth0.rp_filter"] = "2"
		}},
		{"rp_filter strict in an IPv6-only network", func(f *Facts) {
			f.IPv4, f.IPv6, f.IPv6Network = false, true, netip.MustParsePrefix("fd00::/48")
			f.Sysctls["net.ipv6.conf.all.forwarding"] = "1"
			f.Sysctls["net.ipv4.conf.all.rp_filter"] = "1"
			f.Env.Network, f.Env.Subnet = netip.Prefix{}, netip.Prefix{}
			f.Env.IPv6Network, f.Env.IPv6Subnet, f.IPv6Lease = f.IPv6Network, netip.MustParsePrefix("fd00:0:0:7::/64"), netip.MustParsePrefix("fd00:0:0:7::/64")
		}},
		{"bridge-nf-call-iptables off without kube-proxy", func(f *Facts) { f.Sysctls["net.bridge.bridge-nf-call-iptables"] = "0" }},
		{"drop chain that accepts the network both ways", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{Verdict: "jump", Target: "DOCKER-USER"}}}}
			f.Chains = map[string]Chain{"ip filter DOCKER-USER": {Family: "ip", Table: "filter", Name: "DOCKER-USER", Rules: []Rule{
				{Src: netip.MustParsePrefix("10.0.0.0/8"), Verdict: "accept"}, {Dst: network, Other: true, Verdict: "accept"}, {Verdict: "return"}}}}
		}},
		{"drop chain accepting the bridge's traffic both ways (wildcard too)", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{IIf: "cni+", Verdict: "accept"}, {OIf: "cni0", Verdict: "accept"}}}}
		}},
		{"drop chain accepting cross-host traffic only, without bridge netfilter", func(f *Facts) {
			delete(f.Sysctls, "net.bridge.bridge-nf-call-iptables")
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "drop", Rules: []Rule{{IIf: "cni0", OIf: "overlay.1", Verdict: "accept"}, {IIf: "overlay.1", OIf: "cni0", Verdict: "accept"}}}}
		}},
		{"drop chain accepting the destination network", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "inet", Table: "fw", Name: "fwd", Policy: "drop", Rules: []Rule{{Other: true, Verdict: "drop"}, {Dst: network, Verdict: "accept"}}}}
		}},
		{"drop chain with an unconditional accept", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "inet", Table: "fw", Name: "fwd", Policy: "drop", Rules: []Rule{{Verdict: "accept"}}}}
		}},
		{"accept chain", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip", Table: "filter", Name: "FORWARD", Policy: "accept"}}
		}},
		{"ip6 drop chain in an IPv4 network", func(f *Facts) {
			f.ForwardChains = []Chain{{Family: "ip6", Table: "filter", Name: "FORWARD", Policy: "drop"}}
		}},
		{"veth smaller than the overlay", func(f *Facts) { f.Ports[0].MTU = 1400 }},
		{"no bridge yet", func(f *Facts) { f.Bridge, f.Ports = Link{Name: "cni0", Missing: true}, nil }},
		{"kernel 5.7 with offload", func(f *Facts) { f.KernelRelease = "5.7.0" }},
		{"old kernel, offload off", func(f *Facts) { f.KernelRelease = "4.19.0-25-amd64"; f.Devices[0].TxCsum = false }},
		{"conflist names this subnet.env", func(f *Facts) { f.CNI.Files[0].SubnetFile = "/run/overlay/subnet.env" }},
		{"conflist names this subnet.env by another path", func(f *Facts) {
			f.CNI.Files[0].SubnetFile, f.CNI.Files[0].SameSubnetFile = "/var/run/overlay/subnet.env", true
		}},
		{"guard admits exactly the leases", func(f *Facts) {
			a := []netip.Addr{netip.MustParseAddr("198.18.0.2")}
			f.Guard = &Guard{Enabled: true, Admitted: map[string][]netip.Addr{"ip": a}, Want: map[string][]netip.Addr{"ip": a}}
		}},
		{"every peer reachable", func(f *Facts) { f.Health = &Health{Reachable: 3} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.change(f)
			if fs := Run(f); !Clean(fs) {
				t.Errorf("problems: %+v", slices.DeleteFunc(fs, func(f Finding) bool { return f.Status != Problem }))
			}
		})
	}
}

func TestLegacyIptablesAndNoKubeProxyAreNotes(t *testing.T) {
	f := healthy()
	f.LegacyTables = []string{"filter", "nat"}
	fs := Run(f)
	if !Clean(fs) {
		t.Fatalf("notes made the host unclean: %+v", fs)
	}
	var notes []string
	for _, x := range fs {
		if x.Status == Note {
			notes = append(notes, x.Check+": "+x.Message+" "+x.Fix)
		}
	}
	all := strings.Join(notes, "\n")
	for _, w := range []string{"forward-policy: legacy iptables tables exist (filter, nat)", "iptables-legacy -S FORWARD", "bridge-netfilter: kube-proxy not found"} {
		if !strings.Contains(all, w) {
			t.Errorf("notes %q lack %q", all, w)
		}
	}
}

func TestKernelVersion(t *testing.T) {
	for in, want := range map[string][3]int{
		"5.4.0-150-generic": {5, 4, 1}, "6.18.44-fc-v782": {6, 18, 1}, "5.7": {5, 7, 1}, "4.19rc1": {4, 19, 1}, "junk": {0, 0, 0}, "": {0, 0, 0},
	} {
		maj, min, ok := kernelVersion(in)
		if got := [3]int{maj, min, map[bool]int{true: 1}[ok]}; got != want {
			t.Errorf("kernelVersion(%q) = %v, want %v", in, got, want)
		}
	}
}
