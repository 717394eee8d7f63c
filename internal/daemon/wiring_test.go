package daemon

// The daemon's wiring, without root: a real etcd (embedded, on loopback),
// fake data planes (fakeplane) and a recording masquerade, behind the
// Kernel seam. What is checked is what the wiring
// alone decides: start-up order and readiness, the hand-off of the lease
// snapshot to the backend and the watch, and a shutdown that ends every
// goroutine before the clients close.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/fakeplane"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// fakeKernel is a fake host behind the Kernel seam: its data planes are
// fakeplane.Planes (no netlink), its masquerade a recorder, and it
// records the order of what the daemon does with it.
type fakeKernel struct {
	mu      sync.Mutex
	ipv6    netip.Addr                  // the underlay's IPv6 address, if any
	planes  map[string]*fakeplane.Plane // by device name: the latest plane built for it
	devices map[string]net.HardwareAddr // the devices on the fake host: ensured, not torn down
	addrs   map[string][]netip.Prefix   // addresses of devices (LinkAddrs), set by a test
	marked  map[string]bool             // MarkTakenOver
	events  []string                    // "masq installed", "masq running", "masq stopped", "masq closed", "plane closed"
	specs   []PlaneSpec                 // what each Plane call was given, in order
	// Checked at the moment each is closed: what was still live.
	runningAtPlaneClose int
	deviceAtMasq        bool
	locked              bool             // LockHost
	masqErr             error            // what Masquerade fails with, if set
	teardownErr         error            // what TeardownUnderlay fails with, if set
	guards              []string         // Guard calls, in order: "IPv4 port 8472"
	guardRemovals       int              // RemoveGuard calls
	guardRefused        []netip.Addr     // what each guard reports as refused
	guardFamilyRemovals []backend.Family // RemoveGuardFamily calls
	// pinger is what Pinger opens, if set (else no socket is allowed);
	// pingedFrom records each Pinger call's family and source.
	pinger     peerhealth.Pinger
	pingedFrom []string
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{planes: map[string]*fakeplane.Plane{}, devices: map[string]net.HardwareAddr{}, marked: map[string]bool{}}
}

// setIPv6 gives the underlay an IPv6 address.
func (k *fakeKernel) setIPv6(a string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ipv6 = netip.MustParseAddr(a)
}

func (k *fakeKernel) note(e string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.events = append(k.events, e)
}

func (k *fakeKernel) log() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.events...)
}

func (k *fakeKernel) Underlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return Underlay{Iface: "eth0", Index: 2, PublicIP: netip.MustParseAddr("198.18.0.1"), PublicIPv6: k.ipv6, MTU: 1500}, nil
}

func (k *fakeKernel) TeardownUnderlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	k.mu.Lock()
	err := k.teardownErr
	k.mu.Unlock()
	if err != nil {
		return Underlay{PublicIP: publicIP, PublicIPv6: publicIPv6}, err
	}
	return k.Underlay(iface, publicIP, publicIPv6)
}

// Plane builds a fake plane for spec's device, as the real factory would
// name it and give it its MAC.
func (k *fakeKernel) Plane(spec PlaneSpec) (backend.Plane, func(), error) {
	name, mac, mtu := vxlan.DeviceName(spec.Backend.VNI), vxlan.VtepMAC(spec.NodeID, spec.Backend.VNI), 1450
	if spec.Family == backend.IPv6 {
		name, mac, mtu = vxlan.DeviceNameV6(spec.Backend.VNI), vxlan.VtepMACv6(spec.NodeID, spec.Backend.VNI), 1430
	}
	if spec.Device != "" {
		name = spec.Device
	}
	if spec.MAC != nil {
		mac = spec.MAC
	}
	p := fakeplane.New(spec.Family, backend.Device{Name: name, Index: 10 + int(spec.Family), MAC: mac, MTU: mtu}, spec.OnPeerProgrammed)
	p.OnPass = spec.OnPass
	k.mu.Lock()
	k.planes[name] = p
	k.specs = append(k.specs, spec)
	k.mu.Unlock()
	return hostPlane{p, k, name}, func() {
		k.mu.Lock()
		if p.Running() {
			k.runningAtPlaneClose++
		}
		k.mu.Unlock()
		k.note("plane closed")
	}, nil
}

// hostPlane is a fake plane whose device is the fake host's: it exists
// from EnsureDevice to Teardown, whichever plane made it.
type hostPlane struct {
	*fakeplane.Plane
	k    *fakeKernel
	name string
}

func (p hostPlane) EnsureDevice(ctx context.Context) (backend.Device, error) {
	dev, err := p.Plane.EnsureDevice(ctx)
	if err == nil {
		p.k.mu.Lock()
		p.k.devices[p.name] = dev.MAC
		p.k.mu.Unlock()
	}
	return dev, err
}

func (p hostPlane) Teardown(ctx context.Context) error {
	err := p.Plane.Teardown(ctx)
	if err == nil {
		p.k.mu.Lock()
		delete(p.k.devices, p.name)
		p.k.mu.Unlock()
	}
	return err
}

// present reports whether the device called name exists on the fake host.
func (k *fakeKernel) present(name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.devices[name]
	return ok
}

// programmed reports whether a plane of the fake host programs a peer
// whose subnet is s.
func (k *fakeKernel) programmed(s netip.Prefix) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.planes {
		if p.Programmed(s) {
			return true
		}
	}
	return false
}

func (k *fakeKernel) Masquerade(networks []masq.Network, _ *slog.Logger) (Masquerader, error) {
	if k.masqErr != nil {
		return nil, k.masqErr
	}
	present := k.present(networks[0].Device)
	k.mu.Lock()
	k.deviceAtMasq = present
	k.mu.Unlock()
	k.note("masq installed for " + networks[0].Prefix.String())
	return fakeMasq{k}, nil
}

func (k *fakeKernel) RemoveMasquerade() (bool, error) {
	k.note("masq removed")
	return false, nil
}

// Guard is a fake VXLAN guard: the fake planes do not drive it.
func (k *fakeKernel) Guard(fam backend.Family, port int, _ *slog.Logger) (Guard, error) {
	k.mu.Lock()
	k.guards = append(k.guards, fmt.Sprintf("%v port %d", fam, port))
	k.mu.Unlock()
	var refused []netip.Addr
	for _, a := range k.guardRefused {
		if a.Is4() == (fam == backend.IPv4) {
			refused = append(refused, a)
		}
	}
	return fakeGuard{fam: fam, refused: refused}, nil
}

func (k *fakeKernel) RemoveGuard() (bool, error) {
	k.mu.Lock()
	k.guardRemovals++
	k.mu.Unlock()
	return false, nil
}

func (k *fakeKernel) RemoveGuardFamily(fam backend.Family) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.guardFamilyRemovals = append(k.guardFamilyRemovals, fam)
	return false, nil
}

type fakeGuard struct {
	fam     backend.Family
	refused []netip.Addr
}

func (g fakeGuard) Admit([]backend.Peer, bool) error { return nil }
func (g fakeGuard) Settle(_, _ []backend.Peer) error { return nil }
func (g fakeGuard) Family() backend.Family           { return g.fam }
func (g fakeGuard) Dropped() (uint64, error)         { return 7, nil }
func (g fakeGuard) Repairs() uint64                  { return 2 }
func (g fakeGuard) Refused() ([]netip.Addr, error)   { return g.refused, nil }
func (g fakeGuard) Close() error                     { return nil }

type fakeMasq struct{ k *fakeKernel }

func (m fakeMasq) Run(ctx context.Context) error {
	m.k.note("masq running")
	<-ctx.Done()
	m.k.note("masq stopped")
	return nil
}

func (m fakeMasq) Close() error { m.k.note("masq closed"); return nil }

func (m fakeMasq) RemoveFlannel() ([]string, error) {
	m.k.note("flannel masq removed")
	return nil, nil
}

func (k *fakeKernel) MarkTakenOver(name string) error {
	k.note("marked " + name)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.marked[name] = true
	return nil
}

func (k *fakeKernel) TakenOver(name string, _ backend.Family) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.marked[name]
}

// Pinger opens the fake host's pinger, if it has one; else no ICMP
// socket is allowed there: the prober reports it and the daemon runs on.
func (k *fakeKernel) Pinger(fam backend.Family, src netip.Addr) (peerhealth.Pinger, string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pingedFrom = append(k.pingedFrom, fam.String()+" "+src.String())
	if k.pinger == nil {
		return nil, "", fmt.Errorf("%w: the fake host has none", peerhealth.ErrNoSocket)
	}
	return k.pinger, "fake", nil
}

// CheckDataPath finds the fake host able to serve any data path.
func (k *fakeKernel) CheckDataPath(DataPath) error { return nil }

// ChooseUnderlay takes the flags as they are: the CLI's tests check the
// choice against real interfaces.
func (k *fakeKernel) ChooseUnderlay(f UnderlayFlags) (UnderlayChoice, error) {
	return UnderlayChoice{PublicIP: f.PublicIP, PublicIPv6: f.PublicIPv6}, nil
}

// LockHost is the host lock of the fake host: one holder at a time.
func (k *fakeKernel) LockHost() (func(), error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locked {
		return nil, fmt.Errorf("%w (the fake host's lock is held)", ErrRunning)
	}
	k.locked = true
	return func() {
		k.mu.Lock()
		k.locked = false
		k.mu.Unlock()
	}, nil
}

func (k *fakeKernel) LinkAddrs(name string) ([]netip.Prefix, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.addrs[name]), nil
}

func (k *fakeKernel) LinkMAC(name string) (net.HardwareAddr, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	mac, ok := k.devices[name]
	return slices.Clone(mac), ok, nil
}

// wiring is one daemon run against srv with a fake kernel.
type wiring struct {
	k      *fakeKernel
	cfg    Config
	health string // base URL of /readyz and friends
	cancel context.CancelFunc
	done   chan error
}

func startWiring(t *testing.T, srv *etcdtest.Server, opts ...func(*Config)) *wiring {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &wiring{k: newFakeKernel(), health: "http://" + ln.Addr().String(), done: make(chan error, 1)}
	w.cfg = Config{
		NodeName:   "wiring",
		SubnetFile: filepath.Join(t.TempDir(), "subnet.env"),
		// No flanneld ran here: not the machine's /run/flannel/subnet.env.
		FlannelSubnetFile: filepath.Join(t.TempDir(), "flannel-subnet.env"),
		IPMasq:            true,
		HealthListener:    ln,
		Kernel:            w.k,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		w.cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if srv != nil { // nil: a test sets Config.Source
		w.cfg.Etcd = etcdclient.Config{Endpoints: []string{srv.Endpoint}}
	}
	for _, o := range opts {
		o(&w.cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() { w.done <- Run(ctx, w.cfg) }()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// ready GETs /readyz and returns nil on 200, else the body.
func (w *wiring) ready() error {
	resp, err := http.Get(w.health + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// routed reports whether a plane of the fake host programs the peer on
// subnet.
func (w *wiring) routed(subnet string) bool { return w.k.programmed(netip.MustParsePrefix(subnet)) }

func putLease(t *testing.T, srv *etcdtest.Server, subnetKey, publicIP, mac string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()
	v := fmt.Sprintf(`{"PublicIP":%q,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":%q}}`, publicIP, mac)
	if _, err := srv.Client(t).Put(ctx, etcdv3.DefaultPrefix+"/subnets/"+subnetKey, v); err != nil {
		t.Fatal(err)
	}
}

func TestWiringStartUpHandOffAndShutdown(t *testing.T) {
	srv := etcdtest.Start(t)
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09") // before start: in Acquire's snapshot
	w := startWiring(t, srv)

	// No network config yet: start-up waits for it, and says so.
	testenv.Eventually(t, testenv.Slack, "readiness to name the missing config", func() error {
		if err := w.ready(); err == nil || !strings.Contains(err.Error(), "read the network config") {
			return fmt.Errorf("readyz: %v", err)
		}
		return nil
	})
	if len(w.k.log()) != 0 || w.routed("10.244.9.0/24") {
		t.Fatalf("the kernel was touched before the lease was held: %v", w.k.log())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()
	if _, err := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix).PutConfig(ctx,
		[]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}

	// The config is re-read after the current pause (at most 1.5 ×
	// maxRetryPause); then the lease, the device, the snapshot's peer,
	// masquerade and subnet.env, and readiness.
	testenv.Eventually(t, maxRetryPause*3/2+testenv.Slack, "the daemon to become ready", w.ready)
	if !w.routed("10.244.9.0/24") {
		t.Errorf("ready, but the peer from the lease snapshot is not programmed")
	}
	env, err := subnet.ReadEnv(w.cfg.SubnetFile)
	if err != nil {
		t.Fatalf("ready, but subnet.env: %v", err)
	}
	if !netip.MustParsePrefix("10.244.0.0/16").Contains(env.Lease().Addr()) || env.Lease() == netip.MustParsePrefix("10.244.9.0/24") {
		t.Errorf("subnet.env names %v", env.Lease())
	}
	w.k.mu.Lock()
	deviceAtMasq := w.k.deviceAtMasq
	w.k.mu.Unlock()
	if !deviceAtMasq {
		t.Errorf("masquerade was installed before the overlay device existed")
	}

	// The watch starts where the snapshot ended: a lease written now
	// arrives as an event; its deletion too.
	later := netip.MustParsePrefix("10.244.10.0/24")
	if env.Lease() == later { // the daemon's random pick: write another
		later = netip.MustParsePrefix("10.244.11.0/24")
	}
	putLease(t, srv, subnet.Key(later), "198.18.0.10", "0e:00:00:00:00:0a")
	testenv.WaitFor(t, testenv.Slack, "a lease written after start-up to be programmed", func() bool { return w.routed(later.String()) })
	if _, err := srv.Client(t).Delete(ctx, etcdv3.DefaultPrefix+"/subnets/10.244.9.0-24"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a deleted lease's route to go", func() bool { return !w.routed("10.244.9.0/24") })

	// Shutdown: every goroutine ends before what it uses is closed.
	w.stop(t)
	want := []string{"masq installed for 10.244.0.0/16", "masq running", "masq stopped", "masq closed", "plane closed"}
	if got := w.k.log(); !slices.Equal(got, want) {
		t.Errorf("kernel seam calls %v, want %v (goroutines stopped before what they use closes, newest first)", got, want)
	}
	if w.k.runningAtPlaneClose != 0 {
		t.Errorf("a plane was closed while it was running")
	}
	if err := w.ready(); err == nil {
		t.Errorf("/readyz still answers 200 after Run returned")
	}
	testenv.Eventually(t, testenv.Slack, "every goroutine of the daemon to end", leftoverGoroutines)
}

// stop ends the run and waits for Run to return nil.
func (w *wiring) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatalf("Run did not return within %s of cancel", testenv.Deadline(testenv.Slack))
	}
}

// A restart resumes the lease watch from the journal the last run kept —
// what changed while it was down arrives as events, nothing is listed —
// and a journal that cannot be read is set aside with a warning.
func TestWiringRestartResumesFromTheLeaseJournal(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()
	if _, err := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix).PutConfig(ctx,
		[]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09")
	subnetFile := filepath.Join(t.TempDir(), "subnet.env")
	run := func() (*wiring, *logBuffer) {
		var logs logBuffer
		w := startWiring(t, srv, func(c *Config) { c.SubnetFile, c.Logger = subnetFile, slog.New(slog.NewJSONHandler(&logs, nil)) })
		testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
		return w, &logs
	}
	w, _ := run()
	testenv.WaitFor(t, testenv.Slack, "the peer to be programmed", func() bool { return w.routed("10.244.9.0/24") })
	w.stop(t)

	// While it is down one peer joins and one leaves.
	putLease(t, srv, "10.244.10.0-24", "198.18.0.10", "0e:00:00:00:00:0a")
	if _, err := srv.Client(t).Delete(ctx, etcdv3.DefaultPrefix+"/subnets/10.244.9.0-24"); err != nil {
		t.Fatal(err)
	}
	w, logs := run()
	// Ready means the lease set as it is now is programmed, not as the
	// journal saved it.
	if !w.routed("10.244.10.0/24") || w.routed("10.244.9.0/24") {
		t.Errorf("ready, but the peers of the journal are programmed, not those of now (joined: %v, left: %v)",
			w.routed("10.244.10.0/24"), w.routed("10.244.9.0/24"))
	}
	if logs.count(t, "lease acquired", `"resumed_from":`) != 1 || logs.count(t, "saved lease set not used, listing every lease") != 0 {
		t.Errorf("the restart did not resume from the journal:\n%s", strings.Join(logs.lines(t), "\n"))
	}
	w.stop(t)

	journal := etcdv3.JournalFile(subnetFile)
	if err := os.WriteFile(journal, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, logs = run()
	testenv.WaitFor(t, testenv.Slack, "the peer to be programmed from a listing", func() bool { return w.routed("10.244.10.0/24") })
	if logs.count(t, "ignoring the lease journal; listing every lease instead", journal) != 1 {
		t.Errorf("a damaged journal was not reported:\n%s", strings.Join(logs.lines(t), "\n"))
	}
	w.stop(t)
	j, _, err := etcdv3.OpenJournal(journal, etcdv3.NewRegistry(nil, etcdv3.DefaultPrefix))
	if err != nil {
		t.Errorf("the damaged journal was not replaced: %v", err)
	}
	j.Close()
}

// leftoverGoroutines names goroutines still running the daemon's code (the
// daemon, its backend, the etcd registry), other than this test's own.
func leftoverGoroutines() error {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "_test.go") {
			continue
		}
		for _, pkg := range []string{"overlay/internal/daemon.", "overlay/backend/vxlan.", "overlay/subnet/etcdv3."} {
			if strings.Contains(g, pkg) {
				left = append(left, strings.SplitN(g, "\n", 3)[:2]...)
				break
			}
		}
	}
	if len(left) > 0 {
		return errors.New(strings.Join(left, "\n"))
	}
	return nil
}

// On a dual-stack host every peer is in both data planes, and counts once:
// /status and the metrics say 2 of 2 for two peers, not 4 (each plane's
// count added up).
func TestWiringDualStackCountsEachPeerOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()
	if _, err := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix).PutConfig(ctx,
		[]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{9, 10} { // before start: the daemon leases neither
		v := fmt.Sprintf(`{"PublicIP":"198.18.0.%d","PublicIPv6":"fd18::%d","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:04:%02x"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:%02x"}}`, n, n, n, n)
		if _, err := srv.Client(t).Put(ctx, fmt.Sprintf("%s/subnets/10.244.%d.0-24&fd00:10:244:%x::-64", etcdv3.DefaultPrefix, n, n), v); err != nil {
			t.Fatal(err)
		}
	}
	var firstPass atomic.Int32 // AfterFirstPass calls: once both planes have passed
	w := startWiring(t, srv, func(c *Config) {
		c.Kernel.(*fakeKernel).setIPv6("fd18::1")
		c.AfterFirstPass = func() { firstPass.Add(1) }
	})
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	testenv.Eventually(t, testenv.Slack, "AfterFirstPass to be called", func() error {
		if n := firstPass.Load(); n != 1 {
			return fmt.Errorf("AfterFirstPass called %d times, want once", n)
		}
		return nil
	})
	testenv.Eventually(t, testenv.Slack, "both peers programmed and counted once", func() error {
		var st Status
		if err := getJSON(w.health+"/status", &st); err != nil {
			return err
		}
		if st.DeviceV6 == "" || st.PeersExpected != 2 || st.PeersProgrammed != 2 {
			return fmt.Errorf("/status: IPv6 device %q, %d peers programmed of %d expected; want both planes and 2 of 2", st.DeviceV6, st.PeersProgrammed, st.PeersExpected)
		}
		body, err := getBody(w.health + "/metrics")
		if err != nil {
			return err
		}
		if peers, prog := metricValue(body, "overlay_peers"), metricValue(body, "overlay_peers_programmed"); peers != 2 || prog != 2 {
			return fmt.Errorf("overlay_peers %d, overlay_peers_programmed %d; want 2 and 2", peers, prog)
		}
		return nil
	})
	if n := firstPass.Load(); n != 1 {
		t.Errorf("after more passes, AfterFirstPass was called %d times; want once", n)
	}
}

func getBody(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func getJSON(url string, v any) error {
	body, err := getBody(url)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(body), v)
}

// Turning IPv6 on and then off again, as configuration.md says: store the
// config, restart host by host. A running host sees the change as pending
// and stays ready; hosts program the IPv4 half of keys written under the
// other config (and count them); a restart rekeys this host's lease with
// its IPv4 subnet kept; and the restart after IPv6 is turned off removes
// the IPv6 device with its routes, and logs it.
func TestWiringIPv6RollOnAndOff(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(3*testenv.Slack))
	defer cancel()
	reg := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix)
	const (
		v4Config   = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
		dualConfig = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`
	)
	putConfig := func(c string) {
		t.Helper()
		if _, err := reg.PutConfig(ctx, []byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	putConfig(v4Config)
	// A host not yet restarted (IPv4-only key) and one restarted
	// (dual-stack key): each is a peer in both networks.
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09")
	if _, err := srv.Client(t).Put(ctx, etcdv3.DefaultPrefix+"/subnets/10.244.10.0-24&fd00:10:244:a::-64",
		`{"PublicIP":"198.18.0.10","PublicIPv6":"fd18::10","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:0a"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:0a"}}`); err != nil {
		t.Fatal(err)
	}

	k := newFakeKernel()
	k.setIPv6("fd18::1")
	subnetFile := filepath.Join(t.TempDir(), "subnet.env")
	run := func() (*wiring, *logBuffer) {
		t.Helper()
		var logs logBuffer
		w := startWiring(t, srv, func(c *Config) {
			c.Kernel, c.SubnetFile, c.Logger = k, subnetFile, slog.New(slog.NewJSONHandler(&logs, nil))
		})
		w.k = k
		testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
		return w, &logs
	}
	status := func(w *wiring) Status {
		t.Helper()
		var st Status
		if err := getJSON(w.health+"/status", &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	programmed := func(w *wiring, want ...string) {
		t.Helper()
		testenv.Eventually(t, testenv.Slack, "peers "+strings.Join(want, ", ")+" programmed", func() error {
			for _, p := range want {
				if !w.routedFamily(p) {
					return fmt.Errorf("no route to %s", p)
				}
			}
			return nil
		})
	}

	// IPv4-only: the dual-stack key's IPv4 half is a peer.
	w, _ := run()
	programmed(w, "10.244.9.0/24", "10.244.10.0/24")
	if st := status(w); st.PeersExpected != 2 || st.PeersIPv4Only != 1 || st.LeasesOrphaned != 0 {
		t.Errorf("IPv4-only host: %d peers expected, %d IPv4 only, %d orphaned; want 2, 1, 0", st.PeersExpected, st.PeersIPv4Only, st.LeasesOrphaned)
	}
	before, err := subnet.ReadEnv(subnetFile)
	if err != nil {
		t.Fatal(err)
	}

	// IPv6 turned on: the running host stays ready, the change pending.
	putConfig(dualConfig)
	testenv.Eventually(t, testenv.Slack, "the change to be reported as pending", func() error {
		if st := status(w); !st.Ready || !strings.Contains(st.ConfigPending, "EnableIPv6 false -> true") {
			return fmt.Errorf("ready %v, pending %q; want ready with the change pending", st.Ready, st.ConfigPending)
		}
		return nil
	})
	w.stop(t)

	// Restarted with IPv6: the lease gains an IPv6 subnet, keeps its IPv4
	// one; the IPv4-only key's IPv4 half is a peer.
	w, _ = run()
	programmed(w, "10.244.9.0/24", "10.244.10.0/24", "fd00:10:244:a::/64")
	env, err := subnet.ReadEnv(subnetFile)
	if err != nil || env.Lease() != before.Lease() || !env.IPv6Lease().IsValid() {
		t.Fatalf("after the restart with IPv6: subnet.env %+v (%v), want the IPv4 lease %s kept and an IPv6 lease", env, err, before.Lease())
	}
	if st := status(w); st.PeersExpected != 2 || st.PeersIPv4Only != 1 || st.LeasesOrphaned != 0 || st.DeviceV6 == "" {
		t.Errorf("dual-stack host: %d peers expected, %d IPv4 only, %d orphaned, IPv6 device %q; want 2, 1, 0 and one", st.PeersExpected, st.PeersIPv4Only, st.LeasesOrphaned, st.DeviceV6)
	}
	body, err := getBody(w.health + "/metrics")
	if err != nil || metricValue(body, "overlay_peers_ipv4_only") != 1 {
		t.Errorf("overlay_peers_ipv4_only %d (err %v), want 1", metricValue(body, "overlay_peers_ipv4_only"), err)
	}

	// IPv6 turned off again, and the host restarted: the IPv6 device goes
	// with its routes.
	putConfig(v4Config)
	testenv.Eventually(t, testenv.Slack, "the change to be reported as pending", func() error {
		if st := status(w); !st.Ready || !strings.Contains(st.ConfigPending, "EnableIPv6 true -> false") {
			return fmt.Errorf("ready %v, pending %q; want ready with the change pending", st.Ready, st.ConfigPending)
		}
		return nil
	})
	w.stop(t)
	w, logs := run()
	programmed(w, "10.244.9.0/24", "10.244.10.0/24")
	if k.present(vxlan.DeviceNameV6(1)) {
		t.Errorf("%s after IPv6 was turned off: present, want it removed", vxlan.DeviceNameV6(1))
	}
	if w.routedFamily("fd00:10:244:a::/64") {
		t.Errorf("the IPv6 route to the peer is left behind")
	}
	if n := logs.count(t, "the network no longer carries IPv6: removed the IPv6 device of an earlier run with its routes, neighbours and FDB entries", `"device":"overlay-v6.1"`); n != 1 {
		t.Errorf("the removal logged %d times, want once:\n%s", n, strings.Join(logs.lines(t), "\n"))
	}
	if env, err := subnet.ReadEnv(subnetFile); err != nil || env.Lease() != before.Lease() || env.IPv6Lease().IsValid() {
		t.Errorf("after the restart without IPv6: subnet.env %+v (%v), want the IPv4 lease %s alone", env, err, before.Lease())
	}
	w.stop(t)
	// operations.md quotes both log messages of the roll.
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(string(doc)), " ")
	for _, msg := range []string{"network config changed while running; restart overlayd on this host to apply it",
		"the network no longer carries IPv6: removed the IPv6 device of an earlier run with its routes, neighbours and FDB entries"} {
		if !strings.Contains(flat, msg) {
			t.Errorf("operations.md does not quote the log message %q", msg)
		}
	}
}

// routedFamily reports whether a plane of the fake host programs the peer
// on subnet, of either family.
func (w *wiring) routedFamily(subnet string) bool { return w.routed(subnet) }

// A host whose public address lies inside the network (issue 28: every
// host then skipped its own lease and reported ready with no peer) refuses
// to start: Run returns one line naming both, before it claims anything,
// and /readyz never answers 200.
func TestWiringRefusesAPublicIPInsideTheNetwork(t *testing.T) {
	// Stored as an older overlayd or etcdctl could: config put refuses it
	// now that hosts hold addresses in it, but not before any host runs.
	srv, reg, ctx := storeWithConfig(t, `{"Network":"198.18.0.0/16","Backend":{"Type":"vxlan"}}`)
	w := startWiring(t, srv)
	var err error
	select {
	case err = <-w.done:
		w.done <- err // for the cleanup
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatalf("overlayd run did not refuse to start within %s; /readyz: %v", testenv.Deadline(testenv.Slack), w.ready())
	}
	want := "this host's public address 198.18.0.1 (interface eth0) is inside Network 198.18.0.0/16 of /coreos.com/network/config"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Run = %v, want one line saying %q", err, want)
	}
	snap, lerr := reg.List(ctx)
	if lerr != nil {
		t.Fatal(lerr)
	}
	alive, lerr := reg.AliveNodes(ctx)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(snap.Leases) != 0 || len(alive) != 0 {
		t.Errorf("the refused start left %d leases and liveness keys %v", len(snap.Leases), alive)
	}
	if len(w.k.log()) != 0 {
		t.Errorf("the refused start touched the kernel: %v", w.k.log())
	}
}

// The takeover of flanneld's device and overlayd teardown go through the
// same seam: the plane Kernel.Plane builds on flannel.1 carries the peers
// (with flanneld's MAC published), and teardown removes it through a plane
// of the same factory, with the lease, the masquerade and subnet.env.
func TestWiringTakeoverAndTeardownShareThePlaneFactory(t *testing.T) {
	srv, reg, ctx := storeWithConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09")
	// flanneld's device on the fake host.
	k := newFakeKernel()
	flannelMAC := net.HardwareAddr{0x5a, 0x8e, 0x11, 0x22, 0x33, 0x01}
	fl, closeFl, err := k.Plane(PlaneSpec{Backend: subnet.BackendConfig{VNI: 1}, Family: backend.IPv4, Device: "flannel.1", MAC: flannelMAC})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.EnsureDevice(ctx); err != nil {
		t.Fatal(err)
	}
	closeFl()

	w := startWiring(t, srv, func(c *Config) { c.Kernel, c.AdoptFlannel = k, true })
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	k.mu.Lock()
	taken := k.planes["flannel.1"]
	k.mu.Unlock()
	if taken == fl.(hostPlane).Plane || !taken.Programmed(netip.MustParsePrefix("10.244.9.0/24")) || k.present(vxlan.DeviceName(1)) {
		t.Fatalf("the peer is not programmed on a plane built for flanneld's device (or overlay.1 was created): %v", k.log())
	}
	snap, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	published := ""
	for _, l := range snap.Leases {
		if l.Attrs.NodeID == "wiring" {
			published, _ = codecs.LeaseVtepMAC(l.Attrs.BackendData, "BackendData")
		}
	}
	if published != flannelMAC.String() {
		t.Errorf("the lease publishes VTEP MAC %q, want flanneld's %s", published, flannelMAC)
	}
	w.stop(t)

	res, err := Teardown(ctx, w.cfg, TeardownOptions{})
	if err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if res.removed(vxlan.DeviceName(1)) || !slices.Equal(res.takenOver(), []string{"flannel.1"}) || res.LeaseRemoved == "" || res.SubnetFile == "" {
		t.Errorf("Teardown = %+v, want flannel.1 (not overlay.1) removed, the lease released and subnet.env removed", res)
	}
	if k.present("flannel.1") {
		t.Errorf("flannel.1 is still present after teardown")
	}
	if log := k.log(); !slices.Contains(log, "masq removed") || !slices.Contains(log, "marked flannel.1") {
		t.Errorf("kernel seam calls %v, want the takeover marked and the masquerade removed", log)
	}
}

// --adopt-flannel refuses to take over a flanneld that served another
// subnet than the lease this host gets (its lease expired and was taken;
// in kube mode, a Node registered again with another podCIDR): by the
// address of flanneld's device, or by flanneld's subnet.env. Run fails
// with ErrFlannelSubnet naming both before it touches the kernel, and
// releases the lease it claimed; a flanneld that served the lease's
// subnet is taken over (TestWiringTakeoverAndTeardownShareThePlaneFactory,
// the e2e tests).
func TestWiringAdoptFlannelRefusesAnotherSubnet(t *testing.T) {
	for _, tc := range []struct {
		name, addr, env, want string
	}{
		{name: "device address", addr: "10.244.77.0/32", want: "its device flannel.1 has address 10.244.77.0/32"},
		{name: "subnet.env", env: "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.77.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n", want: "flannel-subnet.env says 10.244.77.1/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A /30 network has one subnet: flanneld's cannot be it.
			srv, reg, ctx := storeWithConfig(t, `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.1.0","Backend":{"Type":"vxlan"}}`)
			k := newFakeKernel()
			k.devices["flannel.1"] = net.HardwareAddr{0x5a, 0x8e, 0x11, 0x22, 0x33, 0x01}
			if tc.addr != "" {
				k.addrs = map[string][]netip.Prefix{"flannel.1": {netip.MustParsePrefix(tc.addr)}}
			}
			var envFile string
			w := startWiring(t, srv, func(c *Config) {
				c.Kernel, c.AdoptFlannel = k, true
				envFile = c.FlannelSubnetFile
				if tc.env != "" {
					if err := os.WriteFile(envFile, []byte(tc.env), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			})
			var err error
			select {
			case err = <-w.done:
				w.done <- err // for the cleanup
			case <-time.After(testenv.Deadline(testenv.Slack)):
				t.Fatalf("overlayd run took flanneld's device over; /readyz: %v", w.ready())
			}
			if !errors.Is(err, ErrFlannelSubnet) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "this host's lease is 10.244.1.0/24") ||
				!strings.Contains(err.Error(), "ip link delete flannel.1") {
				t.Fatalf("Run = %v, want ErrFlannelSubnet saying %q and the lease 10.244.1.0/24", err, tc.want)
			}
			if log := k.log(); len(log) != 0 || len(k.specs) != 0 {
				t.Errorf("the refused start touched the kernel: %v, planes %+v", log, k.specs)
			}
			if snap, err := reg.List(ctx); err != nil || len(snap.Leases) != 0 {
				t.Errorf("the refused start left its lease: %+v, %v", snap.Leases, err)
			}
		})
	}
}

// Teardown builds its planes from the network config etcd holds, as
// `overlayd run` does: the stored Backend (type, VNI, port,
// DirectRouting, MTU), not only its VNI under the default type, and not
// --vni, which names the device only when etcd cannot be reached.
func TestWiringTeardownBuildsPlanesFromTheStoredBackend(t *testing.T) {
	srv, reg, ctx := storeWithConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":5,"Port":4789,"DirectRouting":true,"MTU":1400}}`)
	k := newFakeKernel()
	k.setIPv6("2001:db8::1")
	w := startWiring(t, srv, func(c *Config) { c.Kernel = k })
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	w.stop(t)
	stored, _, err := reg.GetConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}

	k.mu.Lock()
	before := len(k.specs)
	k.mu.Unlock()
	res, err := Teardown(ctx, w.cfg, TeardownOptions{VNI: 1})
	if err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if res.Device != "overlay.5" || !res.removed("overlay.5") || !res.removed("overlay-v6.5") || k.present("overlay.5") || k.present("overlay-v6.5") {
		t.Errorf("Teardown = %+v, want overlay.5 and overlay-v6.5 (the stored VNI's, not --vni's) removed", res)
	}
	k.mu.Lock()
	specs := slices.Clone(k.specs[before:])
	k.mu.Unlock()
	if len(specs) != 2 {
		t.Fatalf("teardown built %d planes, want one per family: %+v", len(specs), specs)
	}
	for _, spec := range specs {
		if !reflect.DeepEqual(spec.Backend, stored.Backend) {
			t.Errorf("teardown's %s plane was built from Backend %+v, want the stored %+v", spec.Family, spec.Backend, stored.Backend)
		}
	}
}

// A teardown on a host whose netlink cannot be opened (no CAP_NET_ADMIN
// in its namespace) fails at once with that error: it removes nothing,
// and above all keeps the lease, as the devices and routes using it stay.
func TestWiringTeardownStopsWithoutNetlink(t *testing.T) {
	srv, reg, ctx := storeWithConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	k := newFakeKernel()
	w := startWiring(t, srv, func(c *Config) { c.Kernel = k })
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	w.stop(t)

	k.mu.Lock()
	k.teardownErr = fmt.Errorf("%w: operation not permitted", errNoNetlink)
	k.mu.Unlock()
	res, err := Teardown(ctx, w.cfg, TeardownOptions{})
	if !errors.Is(err, errNoNetlink) || res.LeaseRemoved != "" || len(res.Warnings) != 0 {
		t.Fatalf("Teardown without netlink = %+v, %v; want the netlink error and nothing done", res, err)
	}
	if !k.present(vxlan.DeviceName(1)) {
		t.Error("overlay.1 was removed although the kernel was unreachable")
	}
	snap, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, l := range snap.Leases {
		held = held || l.Attrs.NodeID == "wiring"
	}
	if !held {
		t.Error("the host's lease was released although its devices stay")
	}
}

// storeWithConfig starts an etcd holding the network config cfg, and
// returns it, its registry and a context bounded for the test.
func storeWithConfig(t *testing.T, cfg string) (*etcdtest.Server, *etcdv3.Registry, context.Context) {
	t.Helper()
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	t.Cleanup(cancel)
	reg := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix)
	if _, err := reg.PutConfig(ctx, []byte(cfg)); err != nil {
		t.Fatal(err)
	}
	return srv, reg, ctx
}

// With --vxlan-guard (the default) each family's plane is built with its
// own guard, for the network's VXLAN port, and the metric has a series per
// family; with --vxlan-guard=false no guard is built and the table of an
// earlier run is removed.
func TestWiringVXLANGuardPerFamily(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("vxlan-guard=%v", on), func(t *testing.T) {
			srv, _, _ := storeWithConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","Port":4789}}`)
			logs := &logBuffer{}
			w := startWiring(t, srv, func(c *Config) {
				c.VXLANGuard = on
				c.Kernel.(*fakeKernel).setIPv6("fd18::1")
				c.Kernel.(*fakeKernel).guardRefused = []netip.Addr{netip.MustParseAddr("198.18.0.77"), netip.MustParseAddr("fd18::77")}
				c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			})
			testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
			body, err := getBody(w.health + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			w.k.mu.Lock()
			guards, removals, specs := slices.Clone(w.k.guards), w.k.guardRemovals, slices.Clone(w.k.specs)
			w.k.mu.Unlock()
			var gates []string
			for _, s := range specs {
				if s.Gate != nil {
					gates = append(gates, fmt.Sprintf("%v plane: %v gate", s.Family, s.Gate.(fakeGuard).fam))
				}
			}
			if !on {
				if len(guards) != 0 || len(gates) != 0 || removals != 1 || strings.Contains(body, "overlay_vxlan_guard_dropped_packets_total{") {
					t.Errorf("guards %q, gates %q, %d removals, metric present %v; want none, none, 1, false",
						guards, gates, removals, strings.Contains(body, "overlay_vxlan_guard_dropped_packets_total{"))
				}
				return
			}
			if want := []string{"IPv4 port 4789", "IPv6 port 4789"}; !slices.Equal(guards, want) {
				t.Errorf("guards built %q, want %q", guards, want)
			}
			if want := []string{"IPv4 plane: IPv4 gate", "IPv6 plane: IPv6 gate"}; !slices.Equal(gates, want) {
				t.Errorf("planes given %q, want %q", gates, want)
			}
			if removals != 0 {
				t.Errorf("the guard table was removed %d times while the guard is on", removals)
			}
			for _, series := range []string{`overlay_vxlan_guard_dropped_packets_total{family="ipv4"} 7`, `overlay_vxlan_guard_dropped_packets_total{family="ipv6"} 7`, `overlay_vxlan_guard_repairs_total{family="ipv4"} 2`} {
				if !strings.Contains(body, series) {
					t.Errorf("/metrics lacks %s", series)
				}
			}
			// The refused sources show in /status and are logged once each,
			// naming the fix.
			testenv.Eventually(t, testenv.Slack, "the refused sources in /status", func() error {
				body, err := getBody(w.health + "/status")
				if err != nil {
					return err
				}
				if !strings.Contains(body, `"guardRefused":["198.18.0.77","fd18::77"]`) {
					return fmt.Errorf("/status: %s", body)
				}
				return nil
			})
			for _, src := range []string{"198.18.0.77", "fd18::77"} {
				if n := logs.count(t, refusedMsg, `"source":"`+src+`"`); n != 1 {
					t.Errorf("%d warnings for refused source %s, want 1", n, src)
				}
			}
			if !strings.Contains(refusedMsg, "--public-ip") || !strings.Contains(refusedMsg, "--vxlan-guard=false") {
				t.Errorf("the warning names neither fix: %q", refusedMsg)
			}
		})
	}
}

// A host starts in a network that carries one family only: the guard's
// sets and chain of the other family, which an earlier run in a
// dual-stack network left, are removed.
func TestWiringVXLANGuardRemovesTheFamilyTheNetworkDropped(t *testing.T) {
	for _, tc := range []struct {
		config string
		want   backend.Family
	}{
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`, backend.IPv6},
		{`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`, backend.IPv4},
	} {
		t.Run("removes "+tc.want.String(), func(t *testing.T) {
			srv, _, _ := storeWithConfig(t, tc.config)
			w := startWiring(t, srv, func(c *Config) { c.VXLANGuard = true; c.Kernel.(*fakeKernel).setIPv6("fd18::1") })
			testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
			w.k.mu.Lock()
			got := slices.Clone(w.k.guardFamilyRemovals)
			w.k.mu.Unlock()
			if !slices.Equal(got, []backend.Family{tc.want}) {
				t.Errorf("RemoveGuardFamily calls %v, want [%v]", got, tc.want)
			}
		})
	}
}
