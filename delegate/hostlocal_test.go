package delegate

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// writeHostLocal lays out a host-local network directory the way host-local
// itself does.
func writeHostLocal(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestSweepHostLocal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "overlay")
	writeHostLocal(t, dir, map[string]string{
		"lock":               "",
		"last_reserved_ip.0": "10.244.7.5",
		"10.244.7.2":         "valid\r\neth0",
		"10.244.7.3":         "valid\r\neth1", // same container, other interface: stale
		"10.244.7.4":         "stale\r\neth0",
		"10.244.7.5":         "oldformat-valid",
		"10.244.7.6":         "oldformat-stale",
		"10.244.7.7":         "", // torn write: not understood, kept
		"notes.txt":          "stale\r\neth0",
		// A dual-stack pod's IPv6 reservations, in the same store.
		"last_reserved_ip.1": "fd00:10:244:7::3",
		"fd00:10:244:7::2":   "valid\r\neth0",
		"fd00:10:244:7::3":   "stale\r\neth0",
	})
	valid := NewValidSet([][2]string{{"valid", "eth0"}, {"oldformat-valid", "eth0"}})
	released, err := SweepHostLocal(dir, valid)
	if err != nil {
		t.Fatalf("SweepHostLocal: %v", err)
	}
	wantReleased := []netip.Addr{netip.MustParseAddr("10.244.7.3"), netip.MustParseAddr("10.244.7.4"), netip.MustParseAddr("10.244.7.6"), netip.MustParseAddr("fd00:10:244:7::3")}
	if diff := cmp.Diff(wantReleased, released, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("released (-want +got):\n%s", diff)
	}
	want := []string{"10.244.7.2", "10.244.7.5", "10.244.7.7", "fd00:10:244:7::2", "last_reserved_ip.0", "last_reserved_ip.1", "lock", "notes.txt"}
	if diff := cmp.Diff(want, dirNames(t, dir)); diff != "" {
		t.Errorf("directory after sweep (-want +got):\n%s", diff)
	}
}

func TestSweepHostLocalMissingDir(t *testing.T) {
	released, err := SweepHostLocal(filepath.Join(t.TempDir(), "none"), NewValidSet(nil))
	if err != nil || len(released) != 0 {
		t.Errorf("SweepHostLocal(missing) = %v, %v; want nothing", released, err)
	}
}

func TestSweepHostLocalCreatesLockWhenMissing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "overlay")
	writeHostLocal(t, dir, map[string]string{"10.244.7.2": "c\r\neth0"})
	if _, err := SweepHostLocal(dir, NewValidSet(nil)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"lock"}, dirNames(t, dir)); diff != "" {
		t.Errorf("directory after sweep (-want +got):\n%s", diff)
	}
}

// TestSweepHostLocalHoldsLock: while host-local (here: the test) holds the
// lock, the sweep waits for it and removes nothing; once it is released the
// sweep completes. The wait is observed in /proc/locks (a blocked flock shows
// as "->"), not guessed with a sleep.
func TestSweepHostLocalHoldsLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "overlay")
	writeHostLocal(t, dir, map[string]string{"lock": "", "10.244.7.2": "stale\r\neth0"})
	lock, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(lock.Fd()), &st); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := SweepHostLocal(dir, NewValidSet(nil))
		done <- err
	}()
	if !pollUntil(testenv.Deadline(testenv.Slack), func() bool { return flockWaiterOn(t, st.Ino) }) {
		t.Fatal("the sweep never waited on host-local's lock")
	}
	if _, err := os.Stat(filepath.Join(dir, "10.244.7.2")); err != nil {
		t.Fatalf("the reservation went while host-local held the lock: %v", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("SweepHostLocal: %v", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("the sweep did not finish after the lock was released")
	}
	if _, err := os.Stat(filepath.Join(dir, "10.244.7.2")); !os.IsNotExist(err) {
		t.Errorf("stale reservation still there after the sweep (%v)", err)
	}
}

// flockWaiterOn reports whether /proc/locks shows a process blocked on a
// FLOCK of the inode ino.
func flockWaiterOn(t *testing.T, ino uint64) bool {
	f, err := os.Open("/proc/locks")
	if err != nil {
		t.Skipf("no /proc/locks: %v", err)
	}
	defer f.Close()
	suffix := fmt.Sprintf(":%d", ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// "1: -> FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
		if len(fields) >= 7 && fields[1] == "->" && fields[2] == "FLOCK" && strings.HasSuffix(fields[6], suffix) {
			return true
		}
	}
	return false
}

// pollUntil polls cond every few milliseconds until it holds or the time is
// up, and reports whether it held.
func pollUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
