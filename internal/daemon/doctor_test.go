package daemon

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/doctor"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// diagnose runs Diagnose for n against the cluster's stored config and
// leases and judges the facts.
func diagnose(t *testing.T, c *cluster, n *node, opts DiagnoseOptions) []doctor.Finding {
	t.Helper()
	nc, _, err := c.reg.GetConfig(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.reg.List(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if opts.CNIConfDir == "" {
		opts.CNIConfDir = t.TempDir()
	}
	facts, err := Diagnose(n.cfg, nc, snap, opts)
	if err != nil {
		t.Fatal(err)
	}
	return doctor.Run(&facts)
}

func checkProblems(fs []doctor.Finding, check string) []doctor.Finding {
	return slices.DeleteFunc(slices.Clone(fs), func(f doctor.Finding) bool { return f.Check != check || f.Status != doctor.Problem })
}

// setTxChecksum turns transmit checksum offload of dev in ns on or off
// (ETHTOOL_STXCSUM), as `ethtool -K dev tx off` does.
func setTxChecksum(t *testing.T, n *node, dev string, on bool) {
	t.Helper()
	err := lab.Do(n.host.NS, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		val := &struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_STXCSUM}
		if on {
			val.data = 1
		}
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [16]byte
		}
		copy(ifr.name[:unix.IFNAMSIZ-1], dev)
		ifr.data = unsafe.Pointer(val)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
		runtime.KeepAlive(val)
		if errno != 0 {
			return fmt.Errorf("ethtool set tx checksumming of %s: %w", dev, errno)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The checksum check reads the real offload state of the real device:
// on a kernel before 5.7 (given, since the test cannot choose the
// kernel it runs on) a device with offload on is a problem naming the
// ethtool fix, the same device with the fix applied is not, and on this
// machine's kernel neither is.
func TestDiagnoseChecksumOffloadOnAnOldKernel(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	own2 := h2.env(t).Lease()
	waitFor(t, testenv.Slack, "h1's route to h2", func() bool { return h1.routes(t)[own2] })
	dev := vxlan.DeviceName(1)

	old := DiagnoseOptions{KernelRelease: "5.4.0-150-generic"}
	got := checkProblems(diagnose(t, c, h1, old), "checksum-offload")
	if len(got) != 1 || got[0].Subject != dev || !strings.Contains(got[0].Fix, "ethtool -K "+dev+" tx-checksum-ip-generic off") {
		t.Fatalf("checksum problems on kernel 5.4 with offload on: %+v; want one naming %s and the ethtool fix", got, dev)
	}
	if got := checkProblems(diagnose(t, c, h1, DiagnoseOptions{}), "checksum-offload"); len(got) != 0 {
		t.Errorf("checksum problems on this kernel: %+v", got)
	}
	setTxChecksum(t, h1, dev, false)
	if got := checkProblems(diagnose(t, c, h1, old), "checksum-offload"); len(got) != 0 {
		t.Errorf("checksum problems on kernel 5.4 with offload off: %+v", got)
	}
}

// Diagnose is read only: on a host whose daemon is stopped and whose
// route to a peer was deleted by hand, it reports the route missing, twice
// over, and the route stays deleted.
func TestDiagnoseChangesNothing(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	own2 := h2.env(t).Lease()
	waitFor(t, testenv.Slack, "h1's route to h2", func() bool { return h1.routes(t)[own2] })
	h1.stop()
	// Delete the route to h2 through the lab's netlink, as by hand.
	nl, err := vxlan.OpenNetlink(h1.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	routes, err := nl.RouteList()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(routes, func(r vxlan.Route) bool { return r.Dst == own2 && r.Protocol == vxlan.RouteProtocol })
	if i < 0 {
		t.Fatalf("no route to %s", own2)
	}
	if errs := nl.Write([]vxlan.Write{{Kind: vxlan.RouteDel, Route: routes[i]}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for range 2 {
		got := checkProblems(diagnose(t, c, h1, DiagnoseOptions{}), "kernel-entries")
		if len(got) != 1 || !strings.Contains(got[0].Message, "route "+own2.String()) {
			t.Fatalf("kernel-entries problems: %+v; want the route to %s missing", got, own2)
		}
	}
	if h1.routes(t)[own2] {
		t.Error("Diagnose put the route back")
	}
}

// guardSet is a GuardReader holding fixed sets.
type guardSet struct {
	on  bool
	set map[string][]netip.Addr
}

func (g guardSet) Admitted(fam string) ([]netip.Addr, bool, error) { return g.set[fam], g.on, nil }

// healthOf is a HealthReader with a fixed summary.
type healthOf struct{ h *doctor.Health }

func (h healthOf) PeerHealth() (*doctor.Health, error) { return h.h, nil }

// The guard's and the prober's checks, through the readers their parts
// of overlayd provide: the guard's set is judged against the peers' public
// addresses as the leases in etcd give them (a peer missing, a stranger
// admitted), the health summary's unreachable peers are problems; without
// readers both are notes.
func TestDiagnoseGuardAndHealthThroughTheirReaders(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	own2 := h2.env(t).Lease()
	waitFor(t, testenv.Slack, "h1's route to h2", func() bool { return h1.routes(t)[own2] })
	peer, stranger := h2.host.IP, netip.MustParseAddr("198.18.0.99")

	for _, tc := range []struct {
		name  string
		opts  DiagnoseOptions
		check string
		want  string // in the problem; "" for none
	}{
		{"no guard", DiagnoseOptions{}, "vxlan-guard", ""},
		{"guard admits the peer", DiagnoseOptions{Guard: guardSet{true, map[string][]netip.Addr{"ip": {peer}}}}, "vxlan-guard", ""},
		{"guard misses the peer", DiagnoseOptions{Guard: guardSet{true, nil}}, "vxlan-guard", "does not admit " + peer.String()},
		{"guard admits a stranger", DiagnoseOptions{Guard: guardSet{true, map[string][]netip.Addr{"ip": {peer, stranger}}}}, "vxlan-guard", "admits " + stranger.String()},
		{"every peer reachable", DiagnoseOptions{Health: healthOf{&doctor.Health{Reachable: 1}}}, "peer-health", ""},
		{"a peer unreachable", DiagnoseOptions{Health: healthOf{&doctor.Health{Unreachable: []doctor.PeerHealth{{Peer: own2.String() + " " + peer.String(), Since: "10:00", Loss: 4}}}}}, "peer-health", "peer " + own2.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkProblems(diagnose(t, c, h1, tc.opts), tc.check)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("problems: %+v", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0].Message, tc.want)):
				t.Errorf("problems %+v, want one saying %q", got, tc.want)
			}
		})
	}
}
