package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// The leak PrepareNetnsDir prevents, reproduced step by step in a private
// mount namespace, so no mount is ever visible outside the test: a named
// namespace mounted in a directory that is not a mount point is hidden when
// another tool later bind-mounts the directory over itself (as iproute2 and
// the CNI plugins' testutils do), and can then no longer be removed.
func TestPreparedNetnsDirSurvivesAnotherToolsSetup(t *testing.T) {
	RequireRoot(t)
	for _, prepared := range []bool{false, true} {
		name := map[bool]string{false: "unprepared", true: "prepared"}[prepared]
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "netns")
			err := inPrivateMountNS(func() error {
				if err := os.Mkdir(dir, 0o755); err != nil {
					return err
				}
				if prepared {
					if err := prepareNetnsDir(dir); err != nil {
						return err
					}
				}
				// Our namespace, mounted as netns.NewNamed does.
				file := filepath.Join(dir, "ns1")
				if err := os.WriteFile(file, nil, 0o444); err != nil {
					return err
				}
				if err := unix.Mount("/proc/thread-self/ns/net", file, "none", unix.MS_BIND, ""); err != nil {
					return err
				}
				// Another tool's set-up, as iproute2 does it.
				if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); errors.Is(err, unix.EINVAL) {
					if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
						return err
					}
				}
				// Its deletion, as netns.DeleteNamed does it.
				if err := unix.Unmount(file, unix.MNT_DETACH); err != nil {
					return err
				}
				return os.Remove(file)
			})
			switch {
			case prepared && err != nil:
				t.Fatalf("deleting a namespace in a prepared directory: %v", err)
			case !prepared && !errors.Is(err, unix.EBUSY):
				// The reproduction itself must show the leak, or the
				// prepared case proves nothing.
				t.Fatalf("unprepared directory: want the leak (EBUSY), got %v", err)
			}
		})
	}
}

// inPrivateMountNS runs fn on a thread with a mount namespace of its own,
// whose mounts nobody else sees. The thread is never handed back to the Go
// scheduler: it exits with the goroutine, and its mount namespace with it.
func inPrivateMountNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("", "/", "none", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}
