package vxlan_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
)

const dev = "overlay.1"

// fakeHost is a fake namespace with an underlay ul0 (198.18.0.1/24, MTU
// 1500) and the config of a backend on it.
func fakeHost(t *testing.T) (*vxlantest.Fake, vxlan.Config) {
	f := vxlantest.NewFake()
	f.AddUnderlay("ul0", 1500, netip.MustParsePrefix("198.18.0.1/24"))
	log, _ := newLogger(t)
	return f, vxlan.Config{
		Underlay:       "ul0",
		LocalIP:        localIP,
		OwnSubnet:      ownSubnet,
		NodeID:         "host-a",
		ResyncInterval: -1,
		DisableWatch:   true,
		Logger:         log,
	}
}

func newBackend(t testing.TB, cfg vxlan.Config, nl vxlan.Netlink) *vxlan.Backend {
	t.Helper()
	b, err := vxlan.New(cfg, nl)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

func reconcile(t testing.TB, b *vxlan.Backend) {
	t.Helper()
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
}

func TestFakeConvergeThenRestartWithZeroWrites(t *testing.T) {
	for _, tt := range []struct {
		v6    bool
		mtu   int
		mac   string
		peers func(...int) []backend.Peer
		state string // with the device's MAC as %s
		ops   []string
	}{
		{
			v6: false, mtu: 1450, mac: vxlan.VtepMAC("host-a", 1).String(), peers: peers,
			state: `device overlay.1 vxlan vni 1 port 8472 local 198.18.0.1 underlay ul0 learning false mtu 1450 mac %s up
addr overlay.1 10.244.1.0/32
route 10.244.2.0/24 via 10.244.2.0 dev overlay.1 onlink
route 10.244.3.0/24 via 10.244.3.0 dev overlay.1 onlink
neigh 10.244.2.0 lladdr 0e:00:00:00:00:02 dev overlay.1
neigh 10.244.3.0 lladdr 0e:00:00:00:00:03 dev overlay.1
fdb 0e:00:00:00:00:02 dst 198.18.0.2 dev overlay.1
fdb 0e:00:00:00:00:03 dst 198.18.0.3 dev overlay.1
`,
			ops: []string{
				"LinkAdd overlay.1", "AddrReplace 3", "LinkSetUp 3",
				"NeighSet 10.244.2.0", "NeighSet 10.244.3.0",
				"FDBSet 0e:00:00:00:00:02", "FDBSet 0e:00:00:00:00:03",
				"RouteReplace 10.244.2.0/24", "RouteReplace 10.244.3.0/24",
			},
		},
		{
			v6: true, mtu: 1430, mac: vxlan.VtepMACv6("host-a", 1).String(), peers: peers6,
			state: `device overlay-v6.1 vxlan vni 1 port 8472 local 2001:db8::1 underlay ul0 learning false mtu 1430 mac %s up
addr overlay-v6.1 fd00:10:244:1::/128
route fd00:10:244:2::/64 via fd00:10:244:2:: dev overlay-v6.1 onlink
route fd00:10:244:3::/64 via fd00:10:244:3:: dev overlay-v6.1 onlink
neigh fd00:10:244:2:: lladdr 0e:00:06:00:00:02 dev overlay-v6.1
neigh fd00:10:244:3:: lladdr 0e:00:06:00:00:03 dev overlay-v6.1
fdb 0e:00:06:00:00:02 dst 2001:db8::2 dev overlay-v6.1
fdb 0e:00:06:00:00:03 dst 2001:db8::3 dev overlay-v6.1
`,
			ops: []string{
				"LinkAdd overlay-v6.1", "AddrReplace 3", "LinkSetUp 3",
				"NeighSet fd00:10:244:2::", "NeighSet fd00:10:244:3::",
				"FDBSet 0e:00:06:00:00:02", "FDBSet 0e:00:06:00:00:03",
				"RouteReplace fd00:10:244:2::/64", "RouteReplace fd00:10:244:3::/64",
			},
		},
	} {
		t.Run(fmt.Sprintf("IPv6=%t", tt.v6), func(t *testing.T) {
			f, cfg, dev := fakeHostOf(t, tt.v6)
			b := newBackend(t, cfg, f)
			if info := ensure(t, b); info.MTU != tt.mtu || info.MAC.String() != tt.mac || info.Name != dev {
				t.Errorf("EnsureDevice = %+v, want %s with MTU %d and the derived MAC %s", info, dev, tt.mtu, tt.mac)
			}
			b.SetPeers(tt.peers(2, 3))
			reconcile(t, b)
			checkState(t, f, dev, fmt.Sprintf(tt.state, tt.mac))
			if d := cmp.Diff(tt.ops, f.Ops()); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}

			// A restarted daemon: a new backend on the converged namespace.
			b2 := newBackend(t, cfg, f)
			before := f.Writes()
			ensure(t, b2)
			b2.SetPeers(tt.peers(3, 2))
			reconcile(t, b2)
			if n := f.Writes() - before; n != 0 {
				t.Errorf("restart on a converged namespace made %d writes, want 0: %v", n, f.Ops())
			}
			s := b2.Status()
			if !s.Ready() || s.PeersProgrammed != 2 || s.Writes != 0 || s.DriftRepairs != 0 || s.Device != dev {
				t.Errorf("status after adoption = %+v", s)
			}
		})
	}
}

// scenario is a starting namespace and a peer set to converge it to, on
// the IPv4 overlay unless v6 says the IPv6 one.
type scenario struct {
	name  string
	v6    bool
	setup func(t *testing.T, f *vxlantest.Fake, cfg vxlan.Config)
	peers []backend.Peer
}

// host is a fresh fake namespace for sc, and its device.
func (sc scenario) host(t *testing.T) (*vxlantest.Fake, vxlan.Config, string) {
	return fakeHostOf(t, sc.v6)
}

// fakeHostOf is fakeHost or, if v6, fakeHost6, with the overlay's device.
func fakeHostOf(t *testing.T, v6 bool) (*vxlantest.Fake, vxlan.Config, string) {
	if v6 {
		f, cfg := fakeHost6(t)
		return f, cfg, dev6
	}
	f, cfg := fakeHost(t)
	return f, cfg, dev
}

var scenarios = []scenario{
	{
		name:  "cold start",
		setup: func(*testing.T, *vxlantest.Fake, vxlan.Config) {},
		peers: peers(2, 3),
	},
	{
		name: "changes: MAC, public IP, add, remove, device drift",
		setup: func(t *testing.T, f *vxlantest.Fake, cfg vxlan.Config) {
			b := newBackend(t, cfg, f)
			b.SetPeers(peers(2, 3, 4))
			reconcile(t, b)
			d, _ := f.LinkByName(dev)
			ext := f.External(false)
			if err := ext.LinkSetMTU(d.Index, 1400); err != nil {
				t.Fatal(err)
			}
			if err := ext.AddrDel(d.Index, netip.MustParsePrefix("10.244.1.0/32")); err != nil {
				t.Fatal(err)
			}
		},
		peers: []backend.Peer{withMAC(peer(2), 2), withIP(peer(3), "198.18.0.33"), peer(5)},
	},
}

// TestFakeEveryInjectedFailureRecovers fails each write of each scenario
// once with each errno, and checks that the next pass converges to exactly
// the state an undisturbed run reaches, after which nothing is written.
func TestFakeEveryInjectedFailureRecovers(t *testing.T) {
	errnos := []struct {
		name  string
		errno syscall.Errno
	}{{"EBUSY", syscall.EBUSY}, {"EEXIST", syscall.EEXIST}, {"ENOENT", syscall.ENOENT}, {"EPERM", syscall.EPERM}}
	for _, sc := range append(scenarios, scenarios6...) {
		// An undisturbed run gives the golden state and the writes to fail.
		f, cfg, dev := sc.host(t)
		sc.setup(t, f, cfg)
		f.Ops()
		b := newBackend(t, cfg, f)
		b.SetPeers(sc.peers)
		reconcile(t, b)
		want := state(t, f, dev)
		if want != golden(cfg, sc.peers) {
			t.Fatalf("%s: undisturbed run (-want +got):\n%s", sc.name, cmp.Diff(golden(cfg, sc.peers), want))
		}
		writes := f.Ops()
		if len(writes) == 0 {
			t.Fatalf("%s: no writes to fail", sc.name)
		}

		for _, w := range writes {
			op, key, _ := strings.Cut(w, " ")
			for _, e := range errnos {
				errno := e.errno
				t.Run(fmt.Sprintf("%s/%s/%s", sc.name, w, e.name), func(t *testing.T) {
					f, cfg, dev := sc.host(t)
					sc.setup(t, f, cfg)
					b := newBackend(t, cfg, f)
					b.SetPeers(sc.peers)
					f.Inject(vxlantest.Fault{Op: op, Match: key, Err: errno, Times: 1})

					err := b.Reconcile(context.Background())
					gone := errno == syscall.ENOENT && strings.HasSuffix(op, "Del")
					switch {
					case gone && err != nil:
						t.Fatalf("first pass: %v; ENOENT on a delete means already gone", err)
					case !gone && !errors.Is(err, errno):
						t.Fatalf("first pass: err = %v, want %v", err, errno)
					}
					if !gone && b.Status().InSync {
						t.Errorf("status says in sync after a failed pass")
					}
					if err := b.Reconcile(context.Background()); err != nil {
						t.Fatalf("retry: %v", err)
					}
					checkState(t, f, dev, want)
					before := f.Writes()
					reconcile(t, b)
					if n := f.Writes() - before; n != 0 {
						t.Errorf("pass after convergence wrote %d times: %v", n, f.Ops())
					}
					if s := b.Status(); !s.Ready() || s.PeersProgrammed != len(sc.peers) {
						t.Errorf("status = %+v", s)
					}
				})
			}
		}
	}
}

func TestFakePersistentFailureKeepsOtherPeersAndOrder(t *testing.T) {
	f, cfg := fakeHost(t)
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3, 4))

	t.Run("route fails: neighbour and FDB stay, others complete", func(t *testing.T) {
		f.Inject(vxlantest.Fault{Op: "RouteReplace", Match: "10.244.3.0/24", Err: syscall.EBUSY})
		for i := range 2 {
			err := b.Reconcile(context.Background())
			if !errors.Is(err, syscall.EBUSY) {
				t.Fatalf("pass %d: err = %v, want EBUSY", i, err)
			}
		}
		s := b.Status()
		if s.InSync || s.PeersProgrammed != 2 || s.Errors != 2 || !errors.Is(s.LastError, syscall.EBUSY) {
			t.Errorf("status = %+v", s)
		}
		want := strings.Replace(golden(cfg, peers(2, 3, 4)), "route 10.244.3.0/24 via 10.244.3.0 dev overlay.1 onlink\n", "", 1)
		checkState(t, f, dev, want)
		f.ClearFaults()
		reconcile(t, b)
		checkState(t, f, dev, golden(cfg, peers(2, 3, 4)))
	})

	t.Run("neighbour fails: that peer's FDB entry and route are not attempted", func(t *testing.T) {
		b.SetPeers(peers(2, 3, 4, 5, 6))
		f.Inject(vxlantest.Fault{Op: "NeighSet", Match: "10.244.5.0", Err: syscall.EPERM})
		f.Ops()
		err := b.Reconcile(context.Background())
		var we *vxlan.WriteError
		if !errors.As(err, &we) || we.Failed != 1 || we.Skipped != 2 || we.Total != 6 || !errors.Is(err, syscall.EPERM) {
			t.Fatalf("err = %#v, want 1 failed and 2 skipped of 6", err)
		}
		if d := cmp.Diff([]string{
			"NeighSet 10.244.5.0", "NeighSet 10.244.6.0", "FDBSet 0e:00:00:00:00:06", "RouteReplace 10.244.6.0/24",
		}, f.Ops()); d != "" {
			t.Errorf("writes (-want +got):\n%s", d)
		}
		f.ClearFaults()
		reconcile(t, b)
		checkState(t, f, dev, golden(cfg, peers(2, 3, 4, 5, 6)))
	})
}

func TestFakeInterruptedDumpsAreRetried(t *testing.T) {
	for _, list := range []string{"RouteList", "NeighList", "FDBList", "AddrList"} {
		t.Run(list, func(t *testing.T) {
			f, cfg := fakeHost(t)
			b := newBackend(t, cfg, f)
			b.SetPeers(peers(2))
			reconcile(t, b) // the device exists now, so AddrList runs

			f.Inject(vxlantest.Fault{Op: list, Err: vxlan.ErrDumpInterrupted, Times: 4})
			if err := b.Reconcile(context.Background()); err != nil {
				t.Fatalf("4 interruptions: %v, want the 5th attempt to succeed", err)
			}
			f.Inject(vxlantest.Fault{Op: list, Err: syscall.EINTR})
			if err := b.Reconcile(context.Background()); !errors.Is(err, syscall.EINTR) {
				t.Fatalf("persistent interruption: err = %v, want EINTR after bounded retries", err)
			}
		})
	}
}

func TestFakeDirectRouting(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("IPv6=%t", v6), func(t *testing.T) {
			f, cfg, dev := fakeHostOf(t, v6)
			cfg.DirectRouting = true
			b := newBackend(t, cfg, f)
			near, far := peer(2), withIP(peer(3), "198.19.0.3") // behind a router: still VXLAN
			if v6 {
				near, far = to6(near), to6(far)
			}
			ps := []backend.Peer{near, far}
			b.SetPeers(ps)
			reconcile(t, b)
			checkState(t, f, dev, goldenWith(cfg, ps, []netip.Prefix{near.Subnet}, nil))

			// Switching DirectRouting off (a restart with new config) moves the
			// peer back onto VXLAN.
			cfg.DirectRouting = false
			b2 := newBackend(t, cfg, f)
			b2.SetPeers(ps)
			reconcile(t, b2)
			checkState(t, f, dev, golden(cfg, ps))
		})
	}
}

func TestFakeForeignRoutesAreLeftAlone(t *testing.T) {
	f, cfg := fakeHost(t)
	b := newBackend(t, cfg, f)
	if _, err := b.EnsureDevice(context.Background()); err != nil {
		t.Fatal(err)
	}
	ul, _ := f.LinkByName("ul0")
	d, _ := f.LinkByName(dev)
	ext := f.External(false)
	onDev := vxlan.Route{Dst: netip.MustParsePrefix("10.250.0.0/24"), LinkIndex: d.Index, Protocol: 4, Scope: 253}
	holding := vxlan.Route{Dst: peer(3).Subnet, Gw: netip.MustParseAddr("198.18.0.254"), LinkIndex: ul.Index, Protocol: 4}
	for _, r := range []vxlan.Route{onDev, holding} {
		if err := ext.RouteReplace(r); err != nil {
			t.Fatal(err)
		}
	}
	b.SetPeers(peers(2, 3))
	reconcile(t, b)
	s := b.Status()
	if s.Conflicts != 1 || s.PeersProgrammed != 1 || !s.InSync {
		t.Errorf("status = %+v, want 1 conflict, 1 peer programmed, in sync", s)
	}
	routes, _ := f.RouteList()
	for _, r := range []vxlan.Route{onDev, holding} {
		if !slices.Contains(routes, r) {
			t.Errorf("foreign route %v was touched; routes now %v", r, routes)
		}
	}
	b.SetPeers(nil)
	reconcile(t, b)
	if routes2, _ := f.RouteList(); !slices.Contains(routes2, onDev) || !slices.Contains(routes2, holding) {
		t.Errorf("removing all peers touched foreign routes: %v", routes2)
	}
}

func TestFakeMismatchedDevice(t *testing.T) {
	tests := []struct {
		name       string
		mutate     func(*vxlan.Link)
		recreate   bool
		fixWrites  []string
		wantReason string
	}{
		{name: "wrong port", mutate: func(l *vxlan.Link) { l.Port = 4789 }, recreate: true},
		{name: "learning on", mutate: func(l *vxlan.Link) { l.Learning = true }, recreate: true},
		{name: "wrong local IP", mutate: func(l *vxlan.Link) { l.Local = netip.MustParseAddr("198.18.0.9") }, recreate: true},
		{name: "wrong MTU and MAC", mutate: func(l *vxlan.Link) { l.MTU = 1300; l.MAC = vxlan.MAC{2, 1, 1, 1, 1, 1} },
			fixWrites: []string{"LinkSetMTU 3", "LinkSetMAC 3", "AddrReplace 3", "LinkSetUp 3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, cfg := fakeHost(t)
			ul, _ := f.LinkByName("ul0")
			mac, _ := backend.MACFrom(vxlan.VtepMAC(cfg.NodeID, 1))
			l := vxlan.Link{Name: dev, Kind: "vxlan", VNI: 1, Port: 8472, Local: localIP, UnderlayIndex: ul.Index, MTU: 1450, MAC: mac}
			tt.mutate(&l)
			if err := f.External(false).LinkAdd(l); err != nil {
				t.Fatal(err)
			}
			b := newBackend(t, cfg, f)
			b.SetPeers(peers(2))
			reconcile(t, b)
			checkState(t, f, dev, golden(cfg, peers(2)))
			d, _ := f.LinkByName(dev)
			ops := f.Ops()
			if tt.recreate {
				if b.Status().DeviceRecreations != 1 || d.Index == 3 {
					t.Errorf("device not recreated: recreations %d, index %d", b.Status().DeviceRecreations, d.Index)
				}
			} else if d.Index != 3 || b.Status().DeviceRecreations != 0 || !slices.Equal(ops[:len(tt.fixWrites)], tt.fixWrites) {
				t.Errorf("device not fixed in place: index %d, writes %v", d.Index, ops)
			}
		})
	}

	t.Run("another device holds the VNI and port", func(t *testing.T) {
		f, cfg := fakeHost(t)
		ul, _ := f.LinkByName("ul0")
		if err := f.External(false).LinkAdd(vxlan.Link{Name: "flannel.1", Kind: "vxlan", VNI: 1, Port: 8472, UnderlayIndex: ul.Index}); err != nil {
			t.Fatal(err)
		}
		b := newBackend(t, cfg, f)
		_, err := b.EnsureDevice(context.Background())
		if !errors.Is(err, syscall.EEXIST) || !strings.Contains(err.Error(), "flannel.1 already uses VNI 1 on port 8472") {
			t.Errorf("err = %v, want EEXIST naming flannel.1", err)
		}
	})
}

func TestFakeTeardown(t *testing.T) {
	f, cfg := fakeHost(t)
	log, logs := newLogger(t)
	cfg.Logger = log
	cfg.DirectRouting = true
	b := newBackend(t, cfg, f)
	far := withIP(peer(3), "203.0.113.3")
	b.SetPeers([]backend.Peer{peer(2), far})
	reconcile(t, b)
	ul, _ := f.LinkByName("ul0")
	foreign := vxlan.Route{Dst: netip.MustParsePrefix("10.99.0.0/16"), Gw: netip.MustParseAddr("198.18.0.254"), LinkIndex: ul.Index, Protocol: 4}
	if err := f.External(false).RouteReplace(foreign); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := b.Teardown(context.Background()); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
		checkState(t, f, dev, "no device overlay.1\n")
	}
	// The log says what each teardown found: the device the first time,
	// nothing the second.
	if n, none := logs.count("removed overlay device"), logs.count("nothing to remove: no overlay device or routes"); n != 1 || none != 1 {
		t.Errorf("logged %d removals and %d 'nothing to remove', want 1 and 1", n, none)
	}
	if !strings.Contains(logs.b.String(), `msg="removed overlay device" component=vxlan device=overlay.1 routes=2 neighbours=1 fdb_entries=1`) {
		t.Errorf("removal not logged with what it removed:\n%s", logs.b.String())
	}
	if routes, _ := f.RouteList(); !slices.Contains(routes, foreign) {
		t.Errorf("teardown removed a foreign route: %v", routes)
	}
	if err := b.Reconcile(context.Background()); err == nil {
		t.Errorf("Reconcile after Teardown succeeded; it must not recreate anything")
	}
	checkState(t, f, dev, "no device overlay.1\n")
}

func TestFakePeerProgrammedHook(t *testing.T) {
	f, cfg := fakeHost(t)
	var mu sync.Mutex
	var got []string
	cfg.OnPeerProgrammed = func(p backend.Peer, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s %s", p.Subnet, p.PublicIP, vxlan.PeerMAC(p)))
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		g := got
		got = nil
		return g
	}
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3))
	f.Inject(vxlantest.Fault{Op: "RouteReplace", Match: "10.244.3.0/24", Err: syscall.EBUSY, Times: 1})
	_ = b.Reconcile(context.Background())
	if d := cmp.Diff([]string{"10.244.2.0/24 198.18.0.2 0e:00:00:00:00:02"}, take()); d != "" {
		t.Errorf("after a pass failing peer 3 (-want +got):\n%s", d)
	}
	reconcile(t, b)
	reconcile(t, b)
	if d := cmp.Diff([]string{"10.244.3.0/24 198.18.0.3 0e:00:00:00:00:03"}, take()); d != "" {
		t.Errorf("after the retry (-want +got):\n%s", d)
	}
	b.SetPeers([]backend.Peer{withMAC(peer(2), 7), peer(3)})
	reconcile(t, b)
	if d := cmp.Diff([]string{"10.244.2.0/24 198.18.0.2 0e:00:00:00:99:07"}, take()); d != "" {
		t.Errorf("after a MAC change (-want +got):\n%s", d)
	}
}

// OnPass follows every pass, failed ones too: the daemon ends its start-up
// settings after the first, whatever its outcome.
func TestFakePassHook(t *testing.T) {
	f, cfg := fakeHost(t)
	var passes atomic.Int32
	cfg.OnPass = func() { passes.Add(1) }
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2))
	f.Inject(vxlantest.Fault{Op: "RouteReplace", Match: "10.244.2.0/24", Err: syscall.EBUSY, Times: 1})
	if err := b.Reconcile(context.Background()); err == nil {
		t.Fatal("the pass with a failing route write succeeded")
	}
	if n := passes.Load(); n != 1 {
		t.Errorf("after a failed pass, OnPass called %d times; want 1", n)
	}
	reconcile(t, b)
	if n := passes.Load(); n != 2 {
		t.Errorf("after a second pass, OnPass called %d times; want 2", n)
	}
}

func TestFakeInvalidPeersAreCounted(t *testing.T) {
	f, cfg := fakeHost(t)
	log, logs := newLogger(t)
	cfg.Logger = log
	b := newBackend(t, cfg, f)
	bad := peer(4)
	bad.Data = vxlan.PeerData(vxlan.MAC{})
	for range 3 {
		b.SetPeers([]backend.Peer{peer(2), bad, {Subnet: ownSubnet, PublicIP: netip.MustParseAddr("198.18.0.9"), Data: peer(9).Data}})
	}
	reconcile(t, b)
	if s := b.Status(); s.Peers != 1 || s.InvalidPeers != 2 || s.PeersProgrammed != 1 {
		t.Errorf("status = %+v", s)
	}
	if n := logs.count("ignoring invalid peer"); n != 2 {
		t.Errorf("logged invalid peers %d times, want once each (2)", n)
	}
}

// The Run loop.

func TestRunCoalescesABurstIntoOnePass(t *testing.T) {
	f, cfg := fakeHost(t)
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2))
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	f.OnWrite(func(op, key string) {
		once.Do(func() {
			close(held)
			<-release
		})
	})
	run(t, b)
	<-held // the first pass is mid-way
	for n := 3; n <= 52; n++ {
		ps := make([]int, 0, n)
		for i := 2; i <= n; i++ {
			ps = append(ps, i)
		}
		b.SetPeers(peers(ps...))
	}
	close(release)
	waitSynced(t, b, 51)
	all := make([]int, 0, 51)
	for i := 2; i <= 52; i++ {
		all = append(all, i)
	}
	checkState(t, f, dev, golden(cfg, peers(all...)))
	if s := b.Status(); s.Passes != 2 {
		t.Errorf("%d passes for 1 + a burst of 50 changes, want 2", s.Passes)
	}
}

func TestRunRetriesWithBackoffAndLogsQuietly(t *testing.T) {
	f, cfg := fakeHost(t)
	log, logs := newLogger(t)
	cfg.Logger = log
	cfg.RetryMin, cfg.RetryMax = time.Millisecond, 4*time.Millisecond
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3))
	f.Inject(vxlantest.Fault{Op: "FDBSet", Match: "0e:00:00:00:00:03", Err: syscall.EBUSY})
	run(t, b)
	waitFor(t, "5 failed passes", func() bool { return b.Status().Errors >= 5 })
	if s := b.Status(); s.Ready() || s.PeersProgrammed != 1 {
		t.Errorf("status while failing = %+v", s)
	}
	f.ClearFaults()
	waitSynced(t, b, 2)
	checkState(t, f, dev, golden(cfg, peers(2, 3)))
	if n := logs.count("reconcile pass failed; retrying with backoff"); n != 1 {
		t.Errorf("failure logged %d times at warn level, want once", n)
	}
	if n := logs.count("back in sync"); n != 1 {
		t.Errorf(`"back in sync" logged %d times, want once`, n)
	}
}

func TestRunRecreatesDeletedDeviceAndReplays(t *testing.T) {
	f, cfg := fakeHost(t)
	cfg.DisableWatch = false
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3, 4))
	run(t, b)
	waitSynced(t, b, 3)
	d, _ := f.LinkByName(dev)
	if err := f.External(true).LinkDel(d.Index); err != nil {
		t.Fatal(err)
	}
	waitState(t, f, dev, golden(cfg, peers(2, 3, 4)))
	waitFor(t, "recreation counted", func() bool { return b.Status().DeviceRecreations == 1 })
	if s := b.Status(); s.DriftRepairs != 0 {
		t.Errorf("replay after recreation counted as %d drift repairs", s.DriftRepairs)
	}
}

func TestRunRepairsDrift(t *testing.T) {
	tests := []struct {
		name   string
		notify bool // the kernel notifies the deletion
		resync time.Duration
		v6     bool
	}{
		{"notified deletions are repaired at once", true, time.Hour, false},
		{"silent drift is repaired by the periodic resync", false, 20 * time.Millisecond, false},
		{"notified deletions on the IPv6 overlay are repaired at once", true, time.Hour, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, cfg, dev := fakeHostOf(t, tt.v6)
			cfg.DisableWatch = false
			cfg.ResyncInterval = tt.resync
			b := newBackend(t, cfg, f)
			ps := peers(2, 3)
			if tt.v6 {
				ps = peers6(2, 3)
			}
			b.SetPeers(ps)
			run(t, b)
			waitSynced(t, b, 2)
			want := state(t, f, dev)
			d, _ := f.LinkByName(dev)
			ext := f.External(tt.notify)
			p := ps[1]
			mac := vxlan.PeerMAC(p)
			for _, err := range []error{
				ext.RouteDel(vxlan.Route{Dst: p.Subnet}),
				ext.NeighDel(vxlan.Neigh{LinkIndex: d.Index, IP: p.Subnet.Addr()}),
				ext.FDBDel(vxlan.FDB{LinkIndex: d.Index, MAC: mac}),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			waitState(t, f, dev, want)
			waitFor(t, "3 drift repairs counted", func() bool { return b.Status().DriftRepairs == 3 })
		})
	}
}

func TestRunResubscribesWhenNotificationsBreak(t *testing.T) {
	f, cfg := fakeHost(t)
	cfg.DisableWatch = false
	cfg.ResyncInterval = time.Hour
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2))
	run(t, b)
	waitSynced(t, b, 1)
	passes := b.Status().Passes
	f.BreakSubscriptions()
	waitFor(t, "a relisting pass after the break", func() bool { return b.Status().Passes > passes })
	want := state(t, f, dev)
	// Only a working (new) subscription can bring this repair before the
	// hour-long resync.
	if err := f.External(true).RouteDel(vxlan.Route{Dst: peer(2).Subnet}); err != nil {
		t.Fatal(err)
	}
	waitState(t, f, dev, want)
}

func TestFakeExternalChanges(t *testing.T) {
	t.Run("an FDB remote appended by hand is pruned", func(t *testing.T) {
		f, cfg := fakeHost(t)
		b := newBackend(t, cfg, f)
		b.SetPeers(peers(2))
		reconcile(t, b)
		d, _ := f.LinkByName(dev)
		mac := vxlan.PeerMAC(peer(2))
		if err := f.External(false).FDBAppend(vxlan.FDB{LinkIndex: d.Index, MAC: mac, Dst: netip.MustParseAddr("198.18.0.77"), State: vxlan.NUDPermanent}); err != nil {
			t.Fatal(err)
		}
		f.Ops()
		reconcile(t, b)
		if d := cmp.Diff([]string{"FDBDel 0e:00:00:00:00:02"}, f.Ops()); d != "" {
			t.Errorf("writes (-want +got):\n%s", d)
		}
		checkState(t, f, dev, golden(cfg, peers(2)))
	})

	t.Run("device set down (routes and neighbours flushed): up again and replayed", func(t *testing.T) {
		f, cfg := fakeHost(t)
		cfg.DisableWatch = false
		cfg.ResyncInterval = time.Hour
		b := newBackend(t, cfg, f)
		b.SetPeers(peers(2, 3))
		run(t, b)
		waitSynced(t, b, 2)
		d, _ := f.LinkByName(dev)
		if err := f.External(true).LinkSetDown(d.Index); err != nil {
			t.Fatal(err)
		}
		waitState(t, f, dev, golden(cfg, peers(2, 3)))
		if s := b.Status(); s.DeviceRecreations != 0 {
			t.Errorf("device recreated (%d), want it fixed in place", s.DeviceRecreations)
		}
	})
}
