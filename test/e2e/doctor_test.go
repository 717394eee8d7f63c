package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/internal/doctor"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
)

// doctorReport is `overlayd doctor -w json`.
type doctorReport struct {
	Clean    bool             `json:"clean"`
	Findings []doctor.Finding `json:"findings"`
}

// runDoctor runs `overlayd doctor -w json` for host n in its namespace,
// with confDir as its CNI config directory, and returns the report and
// the exit code.
func runDoctor(t *testing.T, n *lab.Node, confDir string) (doctorReport, int) {
	t.Helper()
	out, err := n.CLI(ctxT(t, time.Minute), "-w", "json", "doctor", "--iface="+n.Iface, "--public-ip="+n.IP.String(),
		"--node-name="+n.Name, "--subnet-file="+n.SubnetFile, "--cni-conf-dir="+confDir)
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("overlayd doctor: %v", err)
	}
	var rep doctorReport
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("overlayd doctor -w json: %v (exit %d, %v): %q", jerr, code, err, out)
	}
	if rep.Clean != (code == 0) {
		t.Errorf("doctor says clean=%v but exits %d", rep.Clean, code)
	}
	return rep, code
}

// problems are the report's problems of check (all checks if "").
func (r doctorReport) problems(check string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range r.Findings {
		if f.Status == doctor.Problem && (check == "" || f.Check == check) {
			out = append(out, f)
		}
	}
	return out
}

// wantProblem runs the doctor and checks that check, and only check,
// reports a problem saying each of want, and that it exits 1.
func wantProblem(t *testing.T, n *lab.Node, confDir, check string, want ...string) {
	t.Helper()
	rep, code := runDoctor(t, n, confDir)
	got := rep.problems(check)
	if code != 1 || len(got) == 0 {
		t.Fatalf("doctor exit %d, problems of %s: %+v; want exit 1 and a problem (all: %+v)", code, check, got, rep.Findings)
	}
	if others := len(rep.problems("")) - len(got); others > 0 {
		t.Errorf("other checks report problems too: %+v", rep.problems(""))
	}
	var text []string
	for _, g := range got {
		text = append(text, g.Message+": "+g.Fix)
	}
	all := strings.Join(text, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("%s's problems %q do not say %q", check, all, w)
		}
	}
}

// wantClean waits until the doctor exits 0 for n (a restarted daemon may
// take a pass to repair what a case broke).
func wantClean(t *testing.T, n *lab.Node, confDir string) {
	t.Helper()
	labtest.Eventually(t, settle, "doctor clean on "+n.Name, func() error {
		rep, code := runDoctor(t, n, confDir)
		if code != 0 {
			return fmt.Errorf("exit %d: %+v", code, rep.problems(""))
		}
		return nil
	})
}

// inNS runs fn in n's namespace.
func inNS(t *testing.T, n *lab.Node, fn func() error) {
	t.Helper()
	if err := lab.Do(n.NS, fn); err != nil {
		t.Fatal(err)
	}
}

func writeSysctl(t *testing.T, n *lab.Node, path, value string) {
	t.Helper()
	inNS(t, n, func() error { return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644) })
}

// `overlayd doctor` on a host of a working two-host cluster with pods
// exits 0; each case then breaks one thing in the host's namespace, as it
// breaks on real hosts, and the doctor names exactly that check with
// what to do and exits 1, until the thing is put back. The checksum
// check, which needs an older kernel, is tested in internal/daemon
// (TestDiagnoseChecksumOffloadOnAnOldKernel).
func TestDoctorFindsEachBrokenPartOfTheHost(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	hosts := labtest.Hosts(t, l, 2)
	h1, h2 := hosts[0], hosts[1]
	pods := labtest.Pods(t, hosts, 1)
	if err := meshErrors(t, hosts, pods); err != nil {
		t.Fatal(err)
	}
	confDir := t.TempDir()
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"overlay","plugins":[
  {"type":"overlay-cni","subnetFile":%q,"delegate":{"hairpinMode":true,"isDefaultGateway":true}},
  {"type":"portmap","capabilities":{"portMappings":true}}]}`, h1.SubnetFile)
	if err := os.WriteFile(filepath.Join(confDir, "10-overlay.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, code := runDoctor(t, h1, confDir)
	if code != 0 {
		t.Fatalf("doctor on a working host: exit %d, problems %+v", code, rep.problems(""))
	}
	for _, f := range rep.Findings {
		// The guard and the prober run in every lab host: both are read.
		if (f.Check == "vxlan-guard" || f.Check == "peer-health") && f.Status != doctor.OK {
			t.Errorf("%s on a working host: %+v, want ok", f.Check, f)
		}
	}
	for _, c := range doctor.Checks {
		found := false
		for _, f := range rep.Findings {
			found = found || f.Check == c.Name
		}
		if !found {
			t.Errorf("no line for check %s", c.Name)
		}
	}

	t.Run("forwarding", func(t *testing.T) {
		writeSysctl(t, h1, "net/ipv4/ip_forward", "0")
		wantProblem(t, h1, confDir, "forwarding", "net.ipv4.ip_forward is 0", "sysctl -w net.ipv4.ip_forward=1")
		writeSysctl(t, h1, "net/ipv4/ip_forward", "1")
		wantClean(t, h1, confDir)
	})

	t.Run("rp-filter", func(t *testing.T) {
		writeSysctl(t, h1, "net/ipv4/conf/eth0/rp_filter", "1")
		wantProblem(t, h1, confDir, "rp-filter", "strict reverse-path filtering on eth0", "rp_filter=2")
		writeSysctl(t, h1, "net/ipv4/conf/eth0/rp_filter", "2") // loose is fine
		wantClean(t, h1, confDir)
	})

	t.Run("forward-policy", func(t *testing.T) {
		// Docker's iptables-nft FORWARD: policy drop, a jump to DOCKER-USER.
		c := nftConn(t, h1)
		filter := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"})
		drop := nftables.ChainPolicyDrop
		fwd := c.AddChain(&nftables.Chain{Name: "FORWARD", Table: filter, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
		user := c.AddChain(&nftables.Chain{Name: "DOCKER-USER", Table: filter})
		c.AddRule(&nftables.Rule{Table: filter, Chain: fwd, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "DOCKER-USER"}}})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.DelTable(filter); _ = c.Flush() })
		wantProblem(t, h1, confDir, "forward-policy", "ip filter FORWARD has policy drop", "10.244.0.0/16", "DOCKER-USER")
		if err := reach(pods[0], pods[1]); err == nil {
			t.Errorf("pods reach each other through the drop: the doctor's problem is not one")
		}
		// What leaves the bridge accepted (iifname "cni0" accept): the
		// answers from other hosts are still dropped.
		ifname := make([]byte, 16)
		copy(ifname, "cni0")
		c.AddRule(&nftables.Rule{Table: filter, Chain: user, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, h1, confDir, "forward-policy", "from other hosts' pods to this host's (in overlay.1, out cni0)")
		// And what goes to the pod network (ip daddr 10.244.0.0/16
		// accept): both ways accepted.
		network := netip.MustParsePrefix("10.244.0.0/16")
		c.AddRule(&nftables.Rule{Table: filter, Chain: user, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(16, 32), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network.Addr().AsSlice()},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		wantClean(t, h1, confDir)
		if err := reach(pods[0], pods[1]); err != nil {
			t.Errorf("pods do not reach each other with the accepts in place: %v", err)
		}
	})

	t.Run("bridge-netfilter", func(t *testing.T) {
		// kube-proxy's evidence: its KUBE-SERVICES chain (iptables-nft).
		c := nftConn(t, h1)
		nat := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"})
		c.AddChain(&nftables.Chain{Name: "KUBE-SERVICES", Table: nat})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.DelTable(nat); _ = c.Flush() })
		var before []byte
		inNS(t, h1, func() (err error) {
			before, err = os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
			return err
		})
		writeSysctl(t, h1, "net/bridge/bridge-nf-call-iptables", "0")
		t.Cleanup(func() { writeSysctl(t, h1, "net/bridge/bridge-nf-call-iptables", string(before)) })
		wantProblem(t, h1, confDir, "bridge-netfilter", "KUBE-SERVICES", "bridge-nf-call-iptables is 0")
		writeSysctl(t, h1, "net/bridge/bridge-nf-call-iptables", "1")
		wantClean(t, h1, confDir)
	})

	t.Run("mtu", func(t *testing.T) {
		veth := podVeth(t, h1)
		setMTU(t, h1, veth, 1500)
		wantProblem(t, h1, confDir, "mtu", "pod veth "+veth.Attrs().Name, "has MTU 1500, above the overlay's 1450")
		setMTU(t, h1, veth, 1450)
		wantClean(t, h1, confDir)
	})

	t.Run("vxlan-port", func(t *testing.T) {
		hl := handle(t, h1)
		eth0, err := hl.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		other := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vx-other"}, VxlanId: 2, Port: 8472, VtepDevIndex: eth0.Attrs().Index, SrcAddr: h1.IP.AsSlice()}
		if err := hl.LinkAdd(other); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hl.LinkDel(other) })
		wantProblem(t, h1, confDir, "vxlan-port", "UDP port 8472 is also used by VXLAN device vx-other (VNI 2)")
		if err := hl.LinkDel(other); err != nil {
			t.Fatal(err)
		}
		wantClean(t, h1, confDir)
	})

	t.Run("cni-config", func(t *testing.T) {
		first := filepath.Join(confDir, "05-mynet.conflist")
		if err := os.WriteFile(first, []byte(`{"cniVersion":"1.0.0","name":"mynet","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, h1, confDir, "cni-config", first, "not overlay's", "10-overlay.conflist is, but comes later")
		if err := os.Remove(first); err != nil {
			t.Fatal(err)
		}
		wantClean(t, h1, confDir)

		// The conflist naming subnet.env by another path (a symlink, as
		// /var/run is /run) is fine; naming another file is not.
		own := filepath.Join(confDir, "10-overlay.conflist")
		writeConf := func(subnetFile string) {
			t.Helper()
			conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"overlay","plugins":[{"type":"overlay-cni","subnetFile":%q}]}`, subnetFile)
			if err := os.WriteFile(own, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		link := filepath.Join(t.TempDir(), "subnet.env")
		if err := os.Symlink(h1.SubnetFile, link); err != nil {
			t.Fatal(err)
		}
		writeConf(link)
		wantClean(t, h1, confDir)
		writeConf(h2.SubnetFile)
		wantProblem(t, h1, confDir, "cni-config", "has overlay-cni read "+h2.SubnetFile+", but overlayd writes "+h1.SubnetFile)
		writeConf(h1.SubnetFile)
		wantClean(t, h1, confDir)
	})

	// With overlayd stopped (the data path stays in place), nothing
	// repairs what is broken by hand until it starts again.
	t.Run("kernel-entries and subnet-env", func(t *testing.T) {
		if err := h1.Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		own2 := lease(t, h2)
		if err := h1.DeleteRoute(own2); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, h1, confDir, "kernel-entries", "route "+own2.String(), "missing or different", "for the peer "+own2.String())

		env, err := os.ReadFile(h1.SubnetFile)
		if err != nil {
			t.Fatal(err)
		}
		own1 := lease(t, h1)
		wrong := netip.PrefixFrom(own2.Addr().Next(), own2.Bits()) // OVERLAY_SUBNET of h2's lease
		bad := strings.Replace(string(env), "OVERLAY_SUBNET="+netip.PrefixFrom(own1.Addr().Next(), own1.Bits()).String(), "OVERLAY_SUBNET="+wrong.String(), 1)
		if bad == string(env) {
			t.Fatalf("subnet.env %q holds no OVERLAY_SUBNET of %s", env, own1)
		}
		if err := os.WriteFile(h1.SubnetFile, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		rep, code := runDoctor(t, h1, confDir)
		if code != 1 || len(rep.problems("subnet-env")) == 0 || !strings.Contains(rep.problems("subnet-env")[0].Message, own2.String()) {
			t.Errorf("doctor with h2's subnet in h1's subnet.env: exit %d, %+v", code, rep.problems("subnet-env"))
		}

		// The VXLAN guard's set without h2's address (removed by hand):
		// h2's packets would be dropped.
		c := nftConn(t, h1)
		gt := &nftables.Table{Family: nftables.TableFamilyINet, Name: guard.TableName}
		set, err := c.GetSetByName(gt, guard.SetName(backend.IPv4))
		if err != nil {
			t.Fatalf("the guard's set: %v", err)
		}
		if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: h2.IP.AsSlice()}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		rep, code = runDoctor(t, h1, confDir)
		if g := rep.problems("vxlan-guard"); code != 1 || len(g) != 1 || !strings.Contains(g[0].Message, "does not admit "+h2.IP.String()) {
			t.Errorf("doctor with h2's address out of the guard's set: exit %d, %+v", code, g)
		}

		// The port held by a process: with the device down (its kernel
		// socket closed), the test binds UDP 8472 itself.
		hl := handle(t, h1)
		vx, err := hl.LinkByName("overlay.1")
		if err != nil {
			t.Fatal(err)
		}
		if err := hl.LinkSetDown(vx); err != nil {
			t.Fatal(err)
		}
		var conn net.PacketConn
		inNS(t, h1, func() (err error) {
			conn, err = net.ListenPacket("udp4", "0.0.0.0:8472")
			return err
		})
		rep, code = runDoctor(t, h1, confDir)
		got := rep.problems("vxlan-port")
		if code != 1 || len(got) != 1 || !strings.Contains(got[0].Message, fmt.Sprintf("a socket on 0.0.0.0:8472 of %s (pid %d)", filepath.Base(os.Args[0])[:min(15, len(filepath.Base(os.Args[0])))], os.Getpid())) {
			t.Errorf("doctor with the port bound by this test: exit %d, %+v", code, got)
		}
		conn.Close()

		if err := h1.Start(); err != nil {
			t.Fatal(err)
		}
		labtest.WaitReady(t, h1)
		wantClean(t, h1, confDir)
	})
}

func nftConn(t *testing.T, n *lab.Node) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(n.NS)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func handle(t *testing.T, n *lab.Node) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// podVeth is the host end of a pod's veth on n's bridge cni0.
func podVeth(t *testing.T, n *lab.Node) netlink.Link {
	t.Helper()
	h := handle(t, n)
	br, err := h.LinkByName("cni0")
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Type() == "veth" && l.Attrs().MasterIndex == br.Attrs().Index {
			return l
		}
	}
	t.Fatalf("no veth on cni0 in %s", n.NSName)
	return nil
}

func setMTU(t *testing.T, n *lab.Node, l netlink.Link, mtu int) {
	t.Helper()
	if err := handle(t, n).LinkSetMTU(l, mtu); err != nil {
		t.Fatal(err)
	}
}

// On dual-stack and IPv6-only networks with pods, a working host is clean
// too (both devices, IPv6 forwarding, the IPv6 subnet in subnet.env), and
// a deleted IPv6 route is found on the IPv6 device.
func TestDoctorOnIPv6Networks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, config, dev string }{
		{"dual stack", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`, "overlay-v6.1"},
		{"IPv6 only", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":6}}`, "overlay-v6.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := labtest.New(t, lab.Config{NetworkConfig: tc.config})
			hosts := labtest.Hosts(t, l, 2)
			h1, h2 := hosts[0], hosts[1]
			labtest.Pods(t, hosts, 1)
			confDir := t.TempDir()
			conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"overlay","plugins":[{"type":"overlay-cni","subnetFile":%q}]}`, h1.SubnetFile)
			if err := os.WriteFile(filepath.Join(confDir, "10-overlay.conflist"), []byte(conflist), 0o644); err != nil {
				t.Fatal(err)
			}
			wantClean(t, h1, confDir)

			if err := h1.Stop(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			own2, err := h2.IPv6Lease()
			if err != nil {
				t.Fatal(err)
			}
			if err := h1.DeleteRoute(own2); err != nil {
				t.Fatal(err)
			}
			wantProblem(t, h1, confDir, "kernel-entries", tc.dev+": route "+own2.String(), "for the peer "+own2.String())
		})
	}
}

// A peer whose VXLAN traffic the underlay drops is, once the prober has
// found it unreachable, the doctor's one problem on another host: the
// peer-health check names that peer (its subnet and public address), and
// only it, with what to do, and the doctor exits 1; once the underlay
// carries the traffic again and the prober finds the peer reachable, the
// doctor is clean.
func TestDoctorFindsAnUnreachablePeer(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{RunArgs: []string{"--peer-probe-sweep=" + healthSweep.String()}})
	hosts := labtest.Hosts(t, l, 3)
	h1, h3 := hosts[0], hosts[2]
	labtest.AddPod(t, h1, "p1") // the bridge plugin turns forwarding on, as on a host with pods
	confDir := t.TempDir()
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"overlay","plugins":[{"type":"overlay-cni","subnetFile":%q}]}`, h1.SubnetFile)
	if err := os.WriteFile(filepath.Join(confDir, "10-overlay.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	leases := map[*lab.Node]netip.Prefix{}
	for _, n := range hosts {
		leases[n] = lease(t, n)
	}
	// states waits until h1's prober reports every peer reachable but
	// h3, which it reports as h3State.
	states := func(h3State peerhealth.State) func() error {
		return func() error {
			ph, err := peerHealth(h1)
			if err != nil {
				return err
			}
			got := map[string]peerhealth.State{}
			for _, p := range ph.Peers {
				got[p.Peer] = p.State
			}
			want := map[string]peerhealth.State{leases[hosts[1]].String(): peerhealth.Reachable, leases[h3].String(): h3State}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("h1 reports %v, want %v", got, want)
			}
			return nil
		}
	}
	labtest.Eventually(t, 2*healthDetect, "h1 finding every peer reachable", states(peerhealth.Reachable))
	if rep, code := runDoctor(t, h1, confDir); code != 0 {
		t.Fatalf("doctor with every peer reachable: exit %d, problems %+v", code, rep.problems(""))
	}

	rules := blockVXLAN(t, l.Underlay.NS, "v-"+h3.Name)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding h3 unreachable", states(peerhealth.Unreachable))
	if rules.dropped(t) == 0 {
		t.Fatal("the underlay rule dropped nothing: the test did not block h3")
	}
	rep, code := runDoctor(t, h1, confDir)
	got := rep.problems("peer-health")
	if code != 1 || len(got) != 1 || len(rep.problems("")) != 1 {
		t.Fatalf("doctor with h3 unreachable: exit %d, problems %+v; want exit 1 and one peer-health problem", code, rep.problems(""))
	}
	p := got[0]
	for _, want := range []string{"peer " + leases[h3].String() + " IPv4 at " + h3.IP.String() + " is unreachable through the overlay since ", "probes lost in a row"} {
		if !strings.Contains(p.Message, want) {
			t.Errorf("peer-health problem %q does not say %q", p.Message, want)
		}
	}
	if !strings.Contains(p.Subject, leases[h3].String()) {
		t.Errorf("peer-health problem's subject %q does not name %s", p.Subject, leases[h3])
	}
	if !strings.Contains(p.Fix, "UDP to the VXLAN port") || !strings.Contains(p.Fix, "run `overlayd doctor` on the peer") {
		t.Errorf("peer-health problem's fix %q does not say what to check", p.Fix)
	}

	rules.remove(t)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding h3 reachable again", states(peerhealth.Reachable))
	rep, code = runDoctor(t, h1, confDir)
	if code != 0 {
		t.Fatalf("doctor with h3 reachable again: exit %d, problems %+v", code, rep.problems(""))
	}
	for _, f := range rep.Findings {
		if f.Check == "peer-health" && f.Status != doctor.OK {
			t.Errorf("peer-health with every peer reachable: %+v, want ok", f)
		}
	}
}
