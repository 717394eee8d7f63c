package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrRunning means an overlayd runs on this host with the same subnet
// file: a second one, or a teardown, must not run under it.
var ErrRunning = errors.New("overlayd is running on this host")

// LockFile is the lock `overlayd run` holds for its lifetime, next to the
// subnet file it owns: <subnet file>.lock, e.g. /run/overlay/subnet.env.lock.
// It holds the daemon's PID for people; the lock itself is an flock(2),
// which the kernel drops when the process ends however it ends, so a
// crashed daemon never leaves a stale lock behind.
func LockFile(subnetFile string) string { return subnetFile + ".lock" }

// hostLock is a held LockFile.
type hostLock struct{ f *os.File }

// lockHost takes the lock of subnetFile without waiting; ErrRunning if
// another process (or another daemon in this one) holds it.
func lockHost(subnetFile string) (*hostLock, error) {
	path := LockFile(subnetFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create directory for %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (pid %s holds %s)", ErrRunning, orUnknown(string(pid)), path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	return &hostLock{f: f}, nil
}

// release drops the lock (the file stays: removing it could race with
// another process that just opened it).
func (l *hostLock) release() { _ = l.f.Close() }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
