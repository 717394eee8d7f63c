package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// The sweep and the probe timeout the test runs with: a peer that goes
// dark is reported within one sweep plus 3 timeouts (operations.md;
// peerhealth's TestScheduleDetectsWithinOneSweepOfGoingDark); the waits
// add healthSlack for a loaded machine (the status command's start and
// the probes' 10 ms spacing among it).
const (
	healthSweep   = 2 * time.Second
	healthTimeout = time.Second // peerhealth.DefaultTimeout, under healthSweep/2
	healthDetect  = healthSweep + peerhealth.DefaultThreshold*healthTimeout
	healthSlack   = 2 * time.Second
)

// Every host probes every peer through the overlay: a peer whose VXLAN
// traffic the underlay drops is reported unreachable by exactly the other
// hosts, with one log line naming it, without making them unready; once
// the underlay carries it again it is reachable again. A stale FDB entry
// written by hand shows as lost probes before the reconciler repairs it.
func TestPeerHealth(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{RunArgs: []string{"--peer-probe-sweep=" + healthSweep.String()}})
	// h1 re-lists the kernel only every 10 minutes: a changed FDB entry
	// (the kernel notifies only deletions) stays until then.
	h1, err := l.AddNode("h1", 1)
	if err != nil {
		t.Fatal(err)
	}
	h1.ExtraArgs = []string{"--kernel-resync=10m"}
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	nodes := []*lab.Node{h1, labtest.StartHost(t, l, "h2", 2), labtest.StartHost(t, l, "h3", 3)}
	for _, n := range nodes {
		labtest.WaitReady(t, n)
	}
	leases := map[*lab.Node]netip.Prefix{}
	for _, n := range nodes {
		leases[n] = lease(t, n)
	}
	h2, h3 := nodes[1], nodes[2]

	// Every host finds every other reachable.
	wantStates := func(n *lab.Node, want map[netip.Prefix]peerhealth.State) error {
		ph, err := peerHealth(n)
		if err != nil {
			return err
		}
		got := map[netip.Prefix]peerhealth.State{}
		for _, p := range ph.Peers {
			got[netip.MustParsePrefix(p.Peer)] = p.State
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("%s reports %v, want %v", n.Name, got, want)
		}
		return nil
	}
	allReachable := func(n *lab.Node) map[netip.Prefix]peerhealth.State {
		want := map[netip.Prefix]peerhealth.State{}
		for _, o := range nodes {
			if o != n {
				want[leases[o]] = peerhealth.Reachable
			}
		}
		return want
	}
	for _, n := range nodes {
		labtest.Eventually(t, 2*healthDetect, n.Name+" finding every peer reachable", func() error { return wantStates(n, allReachable(n)) })
	}
	logFrom := map[*lab.Node]int{}
	for _, n := range nodes {
		logFrom[n] = len(readLog(t, n))
	}

	// The underlay drops h3's VXLAN traffic, both ways.
	blocked := time.Now()
	rules := blockVXLAN(t, l.Underlay.NS, "v-"+h3.Name)
	for _, n := range []*lab.Node{h1, h2} {
		want := allReachable(n)
		want[leases[h3]] = peerhealth.Unreachable
		labtest.Eventually(t, healthDetect+healthSlack, n.Name+" reporting h3 unreachable within one sweep and 3 probe timeouts", func() error { return wantStates(n, want) })
		t.Logf("%s reports h3 unreachable %s after the block (bound %s)", n.Name, time.Since(blocked).Round(time.Millisecond), healthDetect)
		lines := logLines(t, n, logFrom[n], "peer unreachable")
		if len(lines) != 1 || !strings.Contains(lines[0], "peer="+leases[h3].String()+" ") {
			t.Fatalf("%s logged %d \"peer unreachable\" lines, want one naming %s: %q", n.Name, len(lines), leases[h3], lines)
		}
		// Readiness does not depend on the peers.
		if ready, body, err := n.Readyz(ctxT(t, 10*time.Second)); err != nil || !ready {
			t.Fatalf("%s not ready while a peer is unreachable: %v %s", n.Name, err, body)
		}
		metrics, err := n.Metrics(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(metrics, `overlay_peers_unreachable{family="ipv4"} 1`) || !strings.Contains(metrics, `overlay_peers_reachable{family="ipv4"} 1`) {
			t.Fatalf("%s metrics do not count 1 reachable and 1 unreachable peer:\n%s", n.Name, grepLines(metrics, "overlay_peers_"))
		}
	}
	// The table says the same, a row per peer.
	table, err := h1.CLI(ctxT(t, 10*time.Second), "status", "--peers")
	if err != nil {
		t.Fatalf("overlayd status --peers on h1: %v: %s", err, table)
	}
	t.Logf("overlayd status --peers on h1:\n%s", table)
	for _, line := range strings.Split(strings.TrimSpace(table), "\n")[1:] {
		f := strings.Fields(line)
		want := "reachable"
		if f[0] == leases[h3].String() {
			want = "unreachable"
		}
		if len(f) < 5 || f[4] != want {
			t.Errorf("h1's status --peers row %q: want %s", line, want)
		}
	}
	// h3 finds both others unreachable.
	labtest.Eventually(t, healthDetect+healthSlack, "h3 reporting both peers unreachable", func() error {
		return wantStates(h3, map[netip.Prefix]peerhealth.State{leases[h1]: peerhealth.Unreachable, leases[h2]: peerhealth.Unreachable})
	})
	if n := rules.dropped(t); n == 0 {
		t.Fatal("the underlay rule dropped nothing: the test did not block h3")
	}

	// The underlay carries h3's traffic again.
	rules.remove(t)
	for _, n := range nodes {
		labtest.Eventually(t, healthDetect+healthSlack, n.Name+" finding every peer reachable again", func() error { return wantStates(n, allReachable(n)) })
	}
	for _, n := range []*lab.Node{h1, h2} {
		lines := logLines(t, n, logFrom[n], "peer reachable again")
		if len(lines) != 1 || !strings.Contains(lines[0], "peer="+leases[h3].String()+" ") {
			t.Fatalf("%s logged %d \"peer reachable again\" lines, want one naming %s: %q", n.Name, len(lines), leases[h3], lines)
		}
	}

	// A stale FDB entry on h1: h2's VTEP MAC sent to an underlay address
	// no host holds.
	st2, err := h2.Status(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mac, err := net.ParseMAC(st2.VtepMAC)
	if err != nil {
		t.Fatal(err)
	}
	lostBefore := peerRecord(t, h1, leases[h2]).Lost
	stale := net.IPv4(198, 18, 0, 250)
	setFDB(t, h1.NS, mac, stale)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 losing probes to h2 through the stale FDB entry", func() error {
		if lost := peerRecord(t, h1, leases[h2]).Lost; lost <= lostBefore {
			return fmt.Errorf("%d probes to h2 lost, as before", lost)
		}
		return nil
	})
	// The loss was the stale entry's: it is still there.
	if dst := fdbDst(t, h1.NS, mac); !dst.Equal(stale) {
		t.Fatalf("h1's FDB entry of %s points to %s, want the stale %s still", mac, dst, stale)
	}
	t.Logf("h1: probes to h2 lost through a stale FDB entry: %d -> %d", lostBefore, peerRecord(t, h1, leases[h2]).Lost)
	setFDB(t, h1.NS, mac, h2.IP.AsSlice())
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding h2 reachable with its FDB entry right", func() error {
		if r := peerRecord(t, h1, leases[h2]); r.State != peerhealth.Reachable || r.ConsecutiveLosses != 0 {
			return fmt.Errorf("h2 is %s with %d lost in a row", r.State, r.ConsecutiveLosses)
		}
		return nil
	})
}

// In a dual-stack network each family's path is probed on its own: with
// the underlay dropping one host's IPv6 VXLAN traffic only, its peer
// finds it unreachable over IPv6 and reachable over IPv4.
func TestPeerHealthDualStack(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{RunArgs: []string{"--peer-probe-sweep=" + healthSweep.String()},
		NetworkConfig: `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`})
	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	states := func(n *lab.Node) (map[string]peerhealth.State, error) {
		ph, err := peerHealth(n)
		if err != nil {
			return nil, err
		}
		out := map[string]peerhealth.State{}
		for _, p := range ph.Peers {
			out[p.Family+" "+p.VTEP] = p.State
		}
		return out, nil
	}
	v4, v6 := lease(t, h2).Addr().String(), lease6(t, h2).Addr().String()
	expect := func(want4, want6 peerhealth.State) func() error {
		return func() error {
			got, err := states(h1)
			if err != nil {
				return err
			}
			want := map[string]peerhealth.State{"IPv4 " + v4: want4, "IPv6 " + v6: want6}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("h1 reports %v, want %v", got, want)
			}
			return nil
		}
	}
	labtest.Eventually(t, 2*healthDetect, "h1 finding h2 reachable in both families", expect(peerhealth.Reachable, peerhealth.Reachable))
	rules := blockVXLANOf(t, l.Underlay.NS, "v-"+h2.Name, unix.ETH_P_IPV6)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding h2 unreachable over IPv6 only", expect(peerhealth.Reachable, peerhealth.Unreachable))
	if rules.dropped(t) == 0 {
		t.Fatal("the underlay rule dropped nothing")
	}
	metrics, err := h1.Metrics(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`overlay_peers_reachable{family="ipv4"} 1`, `overlay_peers_unreachable{family="ipv6"} 1`, `overlay_peers_unreachable{family="ipv4"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("h1's metrics lack %s:\n%s", want, grepLines(metrics, "overlay_peers_"))
		}
	}
	rules.remove(t)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding h2 reachable again over IPv6", expect(peerhealth.Reachable, peerhealth.Reachable))
}

// peerHealth runs `overlayd status --peers -w json` on n.
func peerHealth(n *lab.Node) (daemon.PeerHealth, error) {
	var ph daemon.PeerHealth
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
	defer cancel()
	out, err := n.CLI(ctx, "status", "--peers", "-w", "json")
	if err != nil {
		return ph, fmt.Errorf("%s: overlayd status --peers: %w: %s", n.Name, err, out)
	}
	if err := json.Unmarshal([]byte(out), &ph); err != nil {
		return ph, fmt.Errorf("%s: overlayd status --peers -w json: %w: %s", n.Name, err, out)
	}
	return ph, nil
}

// peerRecord is n's record of the peer on lease.
func peerRecord(t *testing.T, n *lab.Node, lease netip.Prefix) peerhealth.PeerHealth {
	t.Helper()
	ph, err := peerHealth(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ph.Peers {
		if p.Peer == lease.String() {
			return p
		}
	}
	t.Fatalf("%s has no record of %s: %+v", n.Name, lease, ph.Peers)
	return peerhealth.PeerHealth{}
}

func readLog(t *testing.T, n *lab.Node) string {
	t.Helper()
	b, err := os.ReadFile(n.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// logLines are the lines of n's log after offset with msg="<msg>".
func logLines(t *testing.T, n *lab.Node, offset int, msg string) []string {
	t.Helper()
	var out []string
	re := regexp.MustCompile(`msg="?` + regexp.QuoteMeta(msg) + `"? `)
	for _, line := range strings.Split(readLog(t, n)[offset:], "\n") {
		if re.MatchString(line) {
			out = append(out, line)
		}
	}
	return out
}

func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// vxlanBlock is an nftables table in the underlay's namespace dropping
// the VXLAN datagrams (UDP 8472) entering and leaving one bridge port.
type vxlanBlock struct {
	c     *nftables.Conn
	table *nftables.Table
	chain *nftables.Chain
}

func blockVXLAN(t *testing.T, ns netns.NsHandle, port string) *vxlanBlock {
	t.Helper()
	return blockVXLANOf(t, ns, port, unix.ETH_P_IP)
}

// blockVXLANOf is blockVXLAN for the underlay's packets of ethernet type
// etherType only (unix.ETH_P_IP, unix.ETH_P_IPV6).
func blockVXLANOf(t *testing.T, ns netns.NsHandle, port string, etherType uint16) *vxlanBlock {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	b := &vxlanBlock{c: c}
	b.table = c.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "e2e_block_vxlan"})
	policy := nftables.ChainPolicyAccept
	b.chain = c.AddChain(&nftables.Chain{Name: "forward", Table: b.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, port)
	for _, key := range []expr.MetaKey{expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME} {
		c.AddRule(&nftables.Rule{Table: b.table, Chain: b.chain, Exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(etherType)},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(8472)},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("block VXLAN on %s in the underlay: %v", port, err)
	}
	t.Cleanup(func() { b.remove(t) })
	return b
}

// dropped is the packets the rules dropped.
func (b *vxlanBlock) dropped(t *testing.T) uint64 {
	t.Helper()
	rules, err := b.c.GetRules(b.table, b.chain)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n
}

func (b *vxlanBlock) remove(t *testing.T) {
	if b.table == nil {
		return
	}
	b.c.DelTable(b.table)
	if err := b.c.Flush(); err != nil {
		t.Errorf("remove the underlay's VXLAN block: %v", err)
	}
	b.table = nil
}

// setFDB points the FDB entry of mac on overlay.1 in ns to dst.
func setFDB(t *testing.T, ns netns.NsHandle, mac net.HardwareAddr, dst net.IP) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev, err := h.LinkByName("overlay.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: dst, HardwareAddr: mac}); err != nil {
		t.Fatalf("set the FDB entry of %s to %s: %v", mac, dst, err)
	}
}

// fdbDst is where the FDB entry of mac on overlay.1 in ns sends frames.
func fdbDst(t *testing.T, ns netns.NsHandle, mac net.HardwareAddr) net.IP {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev, err := h.LinkByName("overlay.1")
	if err != nil {
		t.Fatal(err)
	}
	fdb, err := h.NeighList(dev.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range fdb {
		if n.HardwareAddr.String() == mac.String() {
			return n.IP
		}
	}
	t.Fatalf("no FDB entry of %s on overlay.1", mac)
	return nil
}

// A peer as flanneld leaves it (flannel.1 holding its subnet's network
// address, no overlayd) answers the probes: overlayd hosts find it
// reachable, and unreachable once the underlay drops its VXLAN traffic.
func TestPeerHealthOfAFlanneldPeer(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{RunArgs: []string{"--peer-probe-sweep=" + healthSweep.String()}})
	ctx := ctxT(t, 2*time.Minute)
	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Its lease first, so h1 leases around it; the data path once h1's
	// lease and MAC are known.
	h2, fl, grant := flannelLeaseHolder(ctx, t, l, cli)
	h1 := labtest.StartHost(t, l, "h1", 1)
	labtest.WaitReady(t, h1)
	st1, err := h1.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mac1, err := net.ParseMAC(st1.VtepMAC)
	if err != nil {
		t.Fatal(err)
	}
	fl.Peers = []flannelhost.Peer{{Subnet: lease(t, h1), PublicIP: h1.IP, VtepMAC: mac1}}
	if _, err := cli.Revoke(ctx, grant); err != nil { // Build writes the lease again, with its own etcd lease
		t.Fatal(err)
	}
	if _, err := fl.Build(ctx, h2.NS, cli, etcdv3.DefaultPrefix); err != nil {
		t.Fatal(err)
	}
	state := func(want peerhealth.State) func() error {
		return func() error {
			ph, err := peerHealth(h1)
			if err != nil {
				return err
			}
			if len(ph.Peers) != 1 || ph.Peers[0].Peer != fl.Subnet.String() || ph.Peers[0].State != want {
				return fmt.Errorf("h1 reports %+v, want %s %s", ph.Peers, fl.Subnet, want)
			}
			return nil
		}
	}
	labtest.Eventually(t, 2*healthDetect, "h1 finding the flanneld peer reachable", state(peerhealth.Reachable))
	rules := blockVXLAN(t, l.Underlay.NS, "v-"+h2.Name)
	labtest.Eventually(t, healthDetect+healthSlack, "h1 finding the flanneld peer unreachable", state(peerhealth.Unreachable))
	if rules.dropped(t) == 0 {
		t.Fatal("the underlay rule dropped nothing")
	}
}

// With DirectRouting a peer on the underlay's subnet is routed over the
// underlay, with no neighbour or FDB entry on the VXLAN device: its probes
// take that route, as its pods' traffic does, and it is reachable.
func TestPeerHealthDirectRouting(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{RunArgs: []string{"--peer-probe-sweep=" + healthSweep.String()},
		NetworkConfig: `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}`})
	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	waitRoutes(t, nodes, settle) // ready is not yet routed to every peer
	if r, ok, err := h1.RouteTo(lease(t, h2)); err != nil || !ok || r.Dev == "overlay.1" {
		t.Fatalf("h1's route to h2 %+v (present %v, %v): want one over the underlay", r, ok, err)
	}
	labtest.Eventually(t, 2*healthDetect, "h1 finding its direct peer reachable", func() error {
		ph, err := peerHealth(h1)
		if err != nil {
			return err
		}
		if len(ph.Peers) != 1 || ph.Peers[0].State != peerhealth.Reachable {
			return fmt.Errorf("h1 reports %+v", ph.Peers)
		}
		return nil
	})
}
