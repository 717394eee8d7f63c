package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// InFullFS runs f with dir, an empty directory on a file system that is
// full (writes fail with ENOSPC), and returns what f returns. The file
// system is a small tmpfs mounted in a mount namespace of one locked
// thread of the test's own, so nothing is mounted where any other
// process, or any other goroutine of the test, could see it; the thread
// and its namespace end with f. f runs on that thread: file work it hands
// to other goroutines does not see the file system.
func InFullFS(t testing.TB, f func(dir string) error) error {
	t.Helper()
	RequireRoot(t)
	mnt := t.TempDir()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
				return err
			}
			dir := filepath.Join(mnt, "d")
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			filler, err := os.Create(filepath.Join(mnt, "filler"))
			if err != nil {
				return err
			}
			defer filler.Close()
			buf := make([]byte, 4096)
			for range 1 << 10 { // 4 MiB at most: far more than 64k
				if _, err := filler.Write(buf); errors.Is(err, syscall.ENOSPC) {
					return f(dir)
				} else if err != nil {
					return err
				}
			}
			return errors.New("the tmpfs never filled up")
		}()
	}()
	return <-done
}
