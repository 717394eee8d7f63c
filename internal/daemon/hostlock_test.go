package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// One overlayd per host whatever its flags: the host lock is keyed on the
// network namespace, not on --subnet-file. A second daemon or a teardown
// there refuses, naming the holder's PID, with another subnet file too; a
// daemon in another namespace (another simulated host) is not affected;
// the lock is free again once released.
func TestHostLockIsPerNetworkNamespace(t *testing.T) {
	a, b := testenv.NewNS(t), testenv.NewNS(t)
	ha, hb := netns.NsHandle(a.Fd()), netns.NsHandle(b.Fd())
	pid := fmt.Sprintf("pid %d", os.Getpid())

	l, err := lockNetns(ha)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockNetns(ha); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), pid) || !strings.Contains(err.Error(), HostLockName) {
		t.Fatalf("second lock in one namespace = %v, want ErrRunning naming %s and %s", err, pid, HostLockName)
	}

	// A second daemon with its own --subnet-file (and no health address)
	// refuses before it looks for anything else.
	dir := t.TempDir()
	err = Run(context.Background(), Config{NodeName: "h1", SubnetFile: filepath.Join(dir, "other", "subnet.env"), NetNS: ha})
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), pid) || !strings.Contains(err.Error(), "stop it first") {
		t.Errorf("a second overlayd with another --subnet-file: %v; want ErrRunning naming %s with advice to stop it", err, pid)
	}
	// troubleshooting.md and configuration.md quote it, the holder shown
	// as overlayd's pid 4242.
	asDocumented := func(err error) string {
		return "Error: " + strings.ReplaceAll(err.Error(), fmt.Sprintf("%s (%s)", pid, comm(t)), "pid 4242 (overlayd)")
	}
	quotes := func(doc, quoted string) {
		t.Helper()
		data, rerr := os.ReadFile(filepath.Join(testenv.RepoRoot(t), doc))
		if rerr != nil {
			t.Fatal(rerr)
		}
		// configuration.md wraps it in running text.
		if !strings.Contains(strings.Join(strings.Fields(string(data)), " "), quoted) {
			t.Errorf("%s does not quote %q", doc, quoted)
		}
	}
	quotes("Documentation/troubleshooting.md", asDocumented(err))
	quotes("Documentation/configuration.md", asDocumented(err))
	_, err = Teardown(context.Background(), Config{NodeName: "h1", SubnetFile: filepath.Join(dir, "third", "subnet.env"), NetNS: ha}, TeardownOptions{VNI: 1})
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("teardown with another --subnet-file: %v; want ErrRunning mentioning --force", err)
	}
	quotes("Documentation/operations.md", asDocumented(err))

	other, err := lockNetns(hb)
	if err != nil {
		t.Fatalf("another network namespace (another host): %v", err)
	}
	other.release()
	l.release()
	if l, err = lockNetns(ha); err != nil {
		t.Fatalf("after release: %v", err)
	}
	l.release()
}
