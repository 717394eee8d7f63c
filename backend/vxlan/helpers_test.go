package vxlan_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var (
	localIP   = netip.MustParseAddr("198.18.0.1")
	ownSubnet = netip.MustParsePrefix("10.244.1.0/24")
)

// peer n (2..254) is host n on the underlay's subnet: 10.244.n.0/24 at
// 198.18.0.n with MAC 0e:00:00:00:00:n.
func peer(n int) backend.Peer {
	return backend.Peer{
		Subnet:   netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n)),
		PublicIP: netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", n)),
		Data:     vxlan.PeerData(vxlan.MAC{0x0e, 0, 0, 0, 0, byte(n)}),
	}
}

func peers(ns ...int) []backend.Peer { return peersOf(peer, ns) }

// peersOf is the peers of the given numbers, made by one.
func peersOf(one func(int) backend.Peer, ns []int) []backend.Peer {
	var out []backend.Peer
	for _, n := range ns {
		out = append(out, one(n))
	}
	return out
}

// manyPeers returns count peers with subnets 10.<100+i/256>.<i%256>.0/24
// and public addresses in 198.19.0.0/16 (not on the underlay's subnet).
func manyPeers(count int) []backend.Peer {
	out := make([]backend.Peer, count)
	for i := range out {
		out[i] = backend.Peer{
			Subnet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/256), byte(i % 256), 0}), 24),
			PublicIP: netip.AddrFrom4([4]byte{198, 19, byte(i / 256), byte(i % 256)}),
			Data:     vxlan.PeerData(vxlan.MAC{0x0e, 1, 0, 0, byte(i >> 8), byte(i)}),
		}
	}
	return out
}

func withMAC(p backend.Peer, last byte) backend.Peer {
	p.Data = vxlan.PeerData(vxlan.MAC{0x0e, 0, 0, 0, 0x99, last})
	return p
}

func withIP(p backend.Peer, ip string) backend.Peer {
	p.PublicIP = netip.MustParseAddr(ip)
	return p
}

// golden renders what vxlantest.State shows for a converged backend with
// cfg's defaults, a 1500-byte underlay called ul0 and the given peers.
func golden(cfg vxlan.Config, ps []backend.Peer) string { return goldenWith(cfg, ps, nil, nil) }

// goldenWith is golden where the peers in direct (by subnet) are routed
// over the underlay, and with extra route lines (other programs' routes).
// The family of cfg.LocalIP chooses the device: overlay.<VNI> for IPv4,
// overlay-v6.<VNI> for IPv6.
func goldenWith(cfg vxlan.Config, ps []backend.Peer, direct []netip.Prefix, extraRoutes []string) string {
	vni := cmpOr(cfg.VNI, vxlan.DefaultVNI)
	port := cmpOr(cfg.Port, vxlan.DefaultPort)
	dev, overhead, mac := vxlan.DeviceName(vni), vxlan.Overhead, vxlan.VtepMAC(cfg.NodeID, vni)
	if cfg.LocalIP.Is6() {
		dev, overhead, mac = vxlan.DeviceNameV6(vni), vxlan.OverheadV6, vxlan.VtepMACv6(cfg.NodeID, vni)
	}
	mtu := cmpOr(cfg.MTU, 1500-overhead)
	own := cfg.OwnSubnet.Addr()
	lines := []string{
		fmt.Sprintf("device %s vxlan vni %d port %d local %s underlay ul0 learning false mtu %d mac %s up",
			dev, vni, port, cfg.LocalIP, mtu, mac),
		fmt.Sprintf("addr %s %s", dev, netip.PrefixFrom(own, own.BitLen())),
	}
	routes := slices.Clone(extraRoutes)
	var neighs, fdbs []string
	for _, p := range ps {
		if slices.Contains(direct, p.Subnet) {
			routes = append(routes, fmt.Sprintf("route %s via %s dev ul0", p.Subnet, p.PublicIP))
			continue
		}
		routes = append(routes, fmt.Sprintf("route %s via %s dev %s onlink", p.Subnet, p.Subnet.Addr(), dev))
		neighs = append(neighs, fmt.Sprintf("neigh %s lladdr %s dev %s", p.Subnet.Addr(), vxlan.PeerMAC(p), dev))
		fdbs = append(fdbs, fmt.Sprintf("fdb %s dst %s dev %s", vxlan.PeerMAC(p), p.PublicIP, dev))
	}
	for _, s := range [][]string{routes, neighs, fdbs} {
		slices.Sort(s)
		lines = append(lines, s...)
	}
	return strings.Join(lines, "\n") + "\n"
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func state(t testing.TB, nl vxlan.Netlink, dev string) string {
	t.Helper()
	s, err := vxlantest.State(nl, dev)
	if err != nil {
		t.Fatalf("render kernel state: %v", err)
	}
	return s
}

func checkState(t testing.TB, nl vxlan.Netlink, dev, want string) {
	t.Helper()
	if d := cmp.Diff(want, state(t, nl, dev)); d != "" {
		t.Fatalf("kernel state (-want +got):\n%s", d)
	}
}

// waitFor waits for cond. The reconciler reacts to kicks and netlink
// notifications, not timers, so the bound is the scheduling margin alone.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, testenv.Slack, what, cond)
}

// waitState polls until the rendered state is want, showing the diff if it
// never gets there.
func waitState(t testing.TB, nl vxlan.Netlink, dev, want string) {
	t.Helper()
	testenv.Eventually(t, testenv.Slack, "the kernel state", func() error {
		got, err := vxlantest.State(nl, dev)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("(-want +got):\n%s", cmp.Diff(want, got))
		}
		return nil
	})
}

// waitSynced waits until the backend applied the current peer set fully.
func waitSynced(t testing.TB, b *vxlan.Backend, peers int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("backend in sync with %d peers programmed", peers), func() bool {
		s := b.Status()
		return s.InSync && !s.Pending && s.PeersProgrammed == peers
	})
}

// run starts b.Run and stops it (waiting for it to return) at cleanup.
func run(t testing.TB, b *vxlan.Backend) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(testenv.Deadline(testenv.Slack)):
			t.Errorf("Run did not return after cancellation")
		}
	})
}

// logBuffer collects log output for assertions and echoes it to t.Log.
type logBuffer struct {
	t  testing.TB
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return l.b.Write(p)
}

func (l *logBuffer) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), "msg=\""+msg+"\"")
}

func newLogger(t testing.TB) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{t: t}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// counting wraps a Netlink and counts the writes that go through it, to
// check write-freedom against the real kernel independently of the
// backend's own counters.
type counting struct {
	vxlan.Netlink
	n atomic.Int64
}

func (c *counting) w() { c.n.Add(1) }

func (c *counting) LinkAdd(l vxlan.Link) error          { c.w(); return c.Netlink.LinkAdd(l) }
func (c *counting) LinkDel(i int) error                 { c.w(); return c.Netlink.LinkDel(i) }
func (c *counting) LinkSetUp(i int) error               { c.w(); return c.Netlink.LinkSetUp(i) }
func (c *counting) LinkSetMTU(i, m int) error           { c.w(); return c.Netlink.LinkSetMTU(i, m) }
func (c *counting) LinkSetMAC(i int, m vxlan.MAC) error { c.w(); return c.Netlink.LinkSetMAC(i, m) }
func (c *counting) AddrReplace(i int, a netip.Prefix) error {
	c.w()
	return c.Netlink.AddrReplace(i, a)
}
func (c *counting) AddrDel(i int, a netip.Prefix) error { c.w(); return c.Netlink.AddrDel(i, a) }
func (c *counting) Write(batch []vxlan.Write) []error {
	c.n.Add(int64(len(batch)))
	return c.Netlink.Write(batch)
}

// vtepMAC is the VTEP MAC of the host with node ID id on VNI 1.
func vtepMAC(id string) vxlan.MAC {
	m, _ := backend.MACFrom(vxlan.VtepMAC(id, 1))
	return m
}
