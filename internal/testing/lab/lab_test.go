package lab

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

func TestRunPID(t *testing.T) {
	for _, tc := range []struct {
		prefix, name string
		pid          int
		ok           bool
	}{
		{"ovl", "ovl1234-h1", 1234, true},
		{"ovl", "ovl1234-t3-h1-p2", 1234, true},
		{"ovl", "ovl-lab-1234-x", 0, false},
		{"ovl", "ovl1234", 0, false},
		{"ovl", "ovlx-h1", 0, false},
		{"ovl", "cni-1234-h1", 0, false},
		{"ovl", "ovl0-h1", 0, false},
		{"ovl-lab-", "ovl-lab-77-123456", 77, true},
		{"ovl-lab-", "ovl-lab-kept-123456", 0, false},
	} {
		pid, ok := runPID(tc.prefix, tc.name)
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("runPID(%q, %q) = %d, %v; want %d, %v", tc.prefix, tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

func TestProcessAlive(t *testing.T) {
	if !processAlive(os.Getpid()) {
		t.Error("this process is not alive?")
	}
	// PIDs above the kernel's pid_max cannot exist.
	if processAlive(1 << 30) {
		t.Error("PID 2^30 is alive?")
	}
}

func TestTailFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := 1; i <= 100; i++ {
		b.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := tailFile(path, 3)
	if err != nil || got != "line 98\nline 99\nline 100\n" {
		t.Errorf("tailFile = %q, %v", got, err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := tailFile(path, 3); got != "" || err != nil {
		t.Errorf("tailFile of an empty file = %q, %v", got, err)
	}
}

func TestRouteString(t *testing.T) {
	r := Route{Dst: netip.MustParsePrefix("10.244.7.0/24"), Via: netip.MustParseAddr("10.244.7.0"), Dev: "overlay.1", Metric: 5123, Onlink: true}
	if got, want := r.String(), "10.244.7.0/24 via 10.244.7.0 dev overlay.1 proto 115 metric 5123 onlink"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// The probes, in one throwaway namespace (root only): a Responder on its
// loopback, WhoAmI, Ping and a Stream.
func TestProbesInANamespace(t *testing.T) {
	testenv.RequireRoot(t)
	name := runPrefix("probe-test") + "ns"
	ns, err := newNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		_ = netns.DeleteNamed(name)
	})
	if err := linkUp(ns, "lo"); err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := Serve(ns, lo, ProbePort)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dst := netip.AddrPortFrom(lo, ProbePort)
	// Bounds on "never", not speeds: the responder runs in this (-race,
	// possibly busy) test process.
	timeout := testenv.Deadline(5 * time.Second)
	if seen, err := WhoAmI(ns, dst, timeout); err != nil || seen != lo {
		t.Errorf("WhoAmI = %s, %v; want %s", seen, err, lo)
	}
	if _, err := Ping(ns, lo, timeout); err != nil {
		t.Errorf("Ping: %v", err)
	}
	// A closed port refuses.
	if _, err := WhoAmI(ns, netip.AddrPortFrom(lo, ProbePort+1), timeout); err == nil {
		t.Error("WhoAmI to a closed port succeeded")
	}
	s, err := StartStream(ns, dst, 5*time.Millisecond, timeout)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testenv.Deadline(testenv.Slack))
	for s.Stats().Received < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := s.Stop()
	if st.Received < 20 || len(st.Lost) > 0 || st.Received != st.Sent {
		t.Errorf("stream to a live responder: %s", st)
	}

	// A responder that goes away: the stream counts the losses.
	r.Close()
	s, err = StartStream(ns, dst, 5*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for len(s.Stats().Lost) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stop(); len(st.Lost) != st.Sent || st.Received != 0 {
		t.Errorf("stream to nothing: %s; want every probe lost", st)
	}
}
