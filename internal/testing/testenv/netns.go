package testenv

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are mounted (`ip netns`).
const NetnsDir = "/var/run/netns"

var (
	netnsDirOnce sync.Once
	netnsDirErr  error
)

// PrepareNetnsDir makes NetnsDir a shared mount point, as `ip netns add`
// does, before this process creates its first named namespace. Every test
// process must, whatever library it creates namespaces with.
//
// Why: on a machine where nothing has done it yet (a fresh boot), the first
// tool that does — iproute2, the CNI plugins' testutils, a container
// runtime — bind-mounts the directory over itself. Namespaces that another
// process had already mounted in it end up hidden under that new mount: the
// name still shows, but unmounting it fails (nothing is mounted at the
// visible path) and removing it fails with EBUSY, so the namespace leaks
// and the next lab's clean-up of stale namespaces fails too. Test packages
// run in parallel, so on a cold machine this happened in `make test`.
//
// An exclusive flock on the directory serialises the check among our test
// processes, so exactly one of them bind-mounts it, before any of them
// creates a namespace.
func PrepareNetnsDir() error {
	netnsDirOnce.Do(func() { netnsDirErr = prepareNetnsDir(NetnsDir) })
	return netnsDirErr
}

func prepareNetnsDir(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	dir, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer dir.Close()
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	defer unix.Flock(int(dir.Fd()), unix.LOCK_UN)

	err = unix.Mount("", path, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil // already a mount point
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s a shared mount: %w", path, err)
	}
	if err := unix.Mount(path, path, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s on itself: %w", path, err)
	}
	if err := unix.Mount("", path, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", path, err)
	}
	return nil
}

// NewNS creates an anonymous-named network namespace with the CNI plugins'
// testutils (whose ns.NetNS the plugin APIs take) after PrepareNetnsDir,
// and deletes it when t ends.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	if err := PrepareNetnsDir(); err != nil {
		t.Fatal(err)
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("remove network namespace %s: %v", n.Path(), err)
		}
	})
	return n
}
