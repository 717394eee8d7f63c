package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

type cluster struct {
	t   *testing.T
	srv *etcdtest.Server
	reg *etcdv3.Registry
	ul  *lab.Underlay
	dir string
}

func newCluster(t *testing.T) *cluster {
	testenv.RequireRoot(t)
	srv := etcdtest.Start(t)
	reg := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix)
	c, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
	defer cancel()
	if _, err := reg.PutConfig(c, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	ul, err := lab.NewUnderlay("")
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(func() {
		if err := ul.Close(); err != nil {
			t.Errorf("lab cleanup: %v", err)
		}
	})
	return &cluster{t: t, srv: srv, reg: reg, ul: ul, dir: t.TempDir()}
}

// node is one simulated host running the daemon in-process.
type node struct {
	host   *lab.Host
	cfg    Config
	cancel context.CancelFunc
	done   chan error
}

func (c *cluster) addHost(name string, n int) *node {
	c.t.Helper()
	h, err := c.ul.AddHost(name, n)
	if err != nil {
		c.t.Fatalf("add host %s: %v", name, err)
	}
	return &node{host: h, cfg: Config{
		Etcd:       etcdclient.Config{Endpoints: []string{c.srv.Endpoint}},
		NodeName:   name,
		Iface:      "eth0",
		SubnetFile: filepath.Join(c.dir, name, "subnet.env"),
		// No flanneld ran here: not the machine's /run/flannel/subnet.env.
		FlannelSubnetFile: filepath.Join(c.dir, name, "flannel", "subnet.env"),
		NetNS:             h.NS,
		IPMasq:            true,
		KernelResync:      200 * time.Millisecond,
		Logger:            testLogger(c.t, name),
	}}
}

// leasedOnce adds a host that runs until it holds a lease and stops:
// what a restart or a teardown then finds. It returns the lease.
func (c *cluster) leasedOnce(t *testing.T, name string, n int) (*node, netip.Prefix) {
	t.Helper()
	h := c.addHost(name, n)
	h.start(t)
	own := h.env(t).Lease()
	h.stop()
	return h, own
}

func testLogger(t *testing.T, name string) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("host", name)
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func (n *node) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- Run(ctx, n.cfg) }()
	t.Cleanup(n.stop)
}

// stop ends the daemon like SIGTERM and returns once Run has returned.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
	n.cancel = nil
}

// env waits for the node's subnet.env and returns it.
func (n *node) env(t *testing.T) subnet.Env {
	t.Helper()
	var e subnet.Env
	waitFor(t, testenv.Slack, n.host.Name+"'s subnet.env", func() bool {
		var err error
		e, err = subnet.ReadEnv(n.cfg.SubnetFile)
		return err == nil
	})
	return e
}

// routes returns the IPv4 subnets n routes through the overlay (our
// protocol).
func (n *node) routes(t *testing.T) map[netip.Prefix]bool { return n.routesOf(t, unix.AF_INET) }

// routesOf returns the subnets of family (AF_INET, AF_INET6) n routes
// through the overlay.
func (n *node) routesOf(t *testing.T, family int) map[netip.Prefix]bool {
	t.Helper()
	h, err := netlink.NewHandleAt(n.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rs, err := h.RouteListFiltered(family, &netlink.Route{Protocol: vxlan.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	out := map[netip.Prefix]bool{}
	for _, r := range rs {
		if r.Dst != nil {
			p, _ := netip.AddrFromSlice(r.Dst.IP)
			p = p.Unmap()
			ones, _ := r.Dst.Mask.Size()
			out[netip.PrefixFrom(p, ones)] = true
		}
	}
	return out
}

// masqRules lists overlayd's nftables table in n's namespace (nil: none).
func masqRules(t *testing.T, n *node) []string {
	t.Helper()
	mq, err := masq.New(netip.MustParsePrefix("10.244.0.0/16"), masq.WithNetNS(n.host.NS))
	if err != nil {
		t.Fatal(err)
	}
	defer mq.Close()
	rules, err := mq.Rules()
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// waitFor is testenv.WaitFor: every wait here scales with the one knob.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// tcpReach listens on to's VTEP address inside to's namespace and dials it
// from from's namespace over the overlay, checking the source address seen.
func tcpReach(t *testing.T, from, to *node, fromAddr, toAddr netip.Addr) error {
	t.Helper()
	var ln net.Listener
	if err := lab.Do(to.host.NS, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(toAddr, 0).String())
		return err
	}); err != nil {
		return fmt.Errorf("listen on %s: %w", toAddr, err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			seen <- "accept: " + err.Error()
			return
		}
		defer conn.Close()
		seen <- conn.RemoteAddr().(*net.TCPAddr).IP.String()
	}()
	var conn net.Conn
	if err := lab.Do(from.host.NS, func() (err error) {
		d := net.Dialer{Timeout: testenv.Deadline(5 * time.Second)}
		conn, err = d.Dial("tcp4", ln.Addr().String())
		return err
	}); err != nil {
		return fmt.Errorf("dial %s from %s: %w", ln.Addr(), from.host.Name, err)
	}
	defer conn.Close()
	select {
	case src := <-seen:
		if src != fromAddr.String() {
			return fmt.Errorf("%s saw the connection from %s, want %s (no NAT on the overlay)", to.host.Name, src, fromAddr)
		}
		return nil
	case <-time.After(testenv.Deadline(testenv.Slack)):
		return errors.New("no connection accepted within 5s")
	}
}

func TestHostsConvergeReachEachOtherAndFollowJoinsAndLeaves(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	e1, e2 := h1.env(t), h2.env(t)
	if e1.Lease() == e2.Lease() {
		t.Fatalf("both hosts hold %s", e1.Lease())
	}
	if e1.MTU != 1450 || e1.Network != netip.MustParsePrefix("10.244.0.0/16") || !e1.IPMasq {
		t.Errorf("h1 subnet.env = %+v, want MTU 1450 (1500 - 50) in 10.244.0.0/16 with IPMasq", e1)
	}
	if rules := masqRules(t, h1); len(rules) == 0 {
		t.Error("h1 has no masquerade table with IPMasq on")
	}
	waitFor(t, testenv.Slack, "h1 and h2 to route to each other", func() bool {
		return h1.routes(t)[e2.Lease()] && h2.routes(t)[e1.Lease()]
	})
	vtep := func(e subnet.Env) netip.Addr { return e.Lease().Addr() }
	if err := tcpReach(t, h1, h2, vtep(e1), vtep(e2)); err != nil {
		t.Fatalf("h1 -> h2 over VXLAN: %v", err)
	}
	if err := tcpReach(t, h2, h1, vtep(e2), vtep(e1)); err != nil {
		t.Fatalf("h2 -> h1 over VXLAN: %v", err)
	}

	// A third host joins: both others route to it and reach it.
	h3 := c.addHost("h3", 3)
	h3.start(t)
	e3 := h3.env(t)
	waitFor(t, testenv.Slack, "h1 and h2 to learn h3", func() bool {
		return h1.routes(t)[e3.Lease()] && h2.routes(t)[e3.Lease()] && len(h3.routes(t)) == 2
	})
	if err := tcpReach(t, h1, h3, vtep(e1), vtep(e3)); err != nil {
		t.Fatalf("h1 -> h3: %v", err)
	}

	// It leaves for good: stop, teardown. Its routes vanish everywhere.
	h3.stop()
	res, err := Teardown(context.Background(), h3.cfg, TeardownOptions{VNI: 1})
	if err != nil || res.LeaseRemoved != e3.Lease().String() {
		t.Fatalf("teardown h3 = %+v, %v", res, err)
	}
	waitFor(t, testenv.Slack, "h3's routes to vanish from h1 and h2", func() bool {
		return !h1.routes(t)[e3.Lease()] && !h2.routes(t)[e3.Lease()]
	})
	if got := h3.routes(t); len(got) != 0 {
		t.Errorf("h3 still has routes after teardown: %v", got)
	}
	if rules := masqRules(t, h3); rules != nil {
		t.Errorf("teardown left the masquerade table: %v", rules)
	}
	for _, f := range []string{h3.cfg.SubnetFile, etcdv3.JournalFile(h3.cfg.SubnetFile)} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("teardown left %s", f)
		}
	}
	hl, err := netlink.NewHandleAt(h3.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	if _, err := hl.LinkByName("overlay.1"); err == nil {
		t.Error("teardown left overlay.1")
	}
}

func TestRestartKeepsSubnetAndDataPath(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	e1, e2 := h1.env(t), h2.env(t)
	waitFor(t, testenv.Slack, "convergence", func() bool { return h1.routes(t)[e2.Lease()] && h2.routes(t)[e1.Lease()] })

	h2.stop() // SIGTERM: the data path stays
	if !h2.routes(t)[e1.Lease()] {
		t.Fatal("h2's route to h1 vanished when its daemon stopped")
	}
	if err := tcpReach(t, h1, h2, e1.Lease().Addr(), e2.Lease().Addr()); err != nil {
		t.Fatalf("traffic with h2's daemon stopped: %v", err)
	}
	h2.start(t)
	if again := h2.env(t); again.Lease() != e2.Lease() {
		t.Fatalf("restart moved h2 from %s to %s", e2.Lease(), again.Lease())
	}
	if err := tcpReach(t, h1, h2, e1.Lease().Addr(), e2.Lease().Addr()); err != nil {
		t.Fatalf("traffic after restart: %v", err)
	}
}

func TestHostileLeasesAreNeverProgrammed(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	h1.start(t)
	e1 := h1.env(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := c.reg.Client()
	// The keys written name other hosts' subnets: a value written over
	// h1's own lease is a takeover, after which h1 rightly stops.
	other := func(third int) string {
		if third == int(e1.Lease().Addr().As4()[2]) {
			third += 50
		}
		return fmt.Sprintf("10.244.%d.0", third)
	}
	hostile := map[string]string{
		other(200) + "-24": `{"PublicIP":"0.0.0.0","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:c8"}}`,
		other(201) + "-24": `{"PublicIP":"198.18.0.201","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"ff:ff:ff:ff:ff:ff"}}`,
		other(202) + "-25": `{"PublicIP":"198.18.0.202","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:ca"}}`,
		"10.99.0.0-24":     `{"PublicIP":"198.18.0.203","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:cb"}}`,
		other(204) + "-24": `{not json`,
		"junk":             `{}`,
	}
	for k, v := range hostile {
		if _, err := cli.Put(ctx, c.reg.Keys.SubnetsPrefix()+k, v); err != nil {
			t.Fatal(err)
		}
	}
	// One valid peer written last: once it is programmed, every hostile key
	// before it has been seen and judged.
	peer := netip.MustParsePrefix(other(9) + "/24")
	good := `{"PublicIP":"198.18.0.9","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:09"}}`
	if _, err := cli.Put(ctx, c.reg.Keys.SubnetsPrefix()+subnet.Key(peer), good); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testenv.Slack, "the valid peer", func() bool { return h1.routes(t)[peer] })
	routes := h1.routes(t)
	if len(routes) != 1 {
		t.Errorf("h1 programmed %v, want only %s", routes, peer)
	}
	if routes[e1.Lease()] {
		t.Errorf("h1 routes its own subnet %s through the overlay", e1.Lease())
	}
	select {
	case err := <-h1.done:
		t.Fatalf("daemon exited on hostile input: %v", err)
	default:
	}
}
