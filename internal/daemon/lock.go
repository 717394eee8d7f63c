package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrRunning means an overlayd runs on this host (in this network
// namespace, or with the same subnet file): a second one, or a teardown,
// must not run under it.
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

// HostLockName is the abstract unix socket `overlayd run` listens on for
// its lifetime, in the network namespace it programs (`ss -xlp | grep
// overlayd` shows it with its process). A second `overlayd run` (or a
// teardown) in that namespace cannot bind it, whatever its flags, and
// learns the first one's PID from the socket's peer credentials.
//
// Keyed on the network namespace because that is what one overlayd owns:
// the VXLAN devices, their UDP port, the routes and the nftables table
// all live there. The lock file beside the subnet file cannot see a
// daemon given another --subnet-file; a path of its own under /run would
// differ between mount namespaces (a container with hostNetwork) and
// could not tell the simulated hosts of the tests apart, each in its own
// network namespace on one machine. An abstract socket has no file to
// leave behind, and the kernel drops it when the process ends, however
// it ends.
const HostLockName = "@overlayd.lock"

// netnsLock is a held HostLockName.
type netnsLock struct {
	ln   net.Listener
	done chan struct{}
}

// lockNetns takes HostLockName in ns (closed: the process's own network
// namespace) without waiting; ErrRunning, naming the holder, if another
// process (or another daemon in this one) holds it.
func lockNetns(ns netns.NsHandle) (*netnsLock, error) {
	var ln net.Listener
	err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("unix", HostLockName)
		return err
	})
	if errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("%w (%s holds %s in this network namespace)", ErrRunning, lockHolder(ns), HostLockName)
	}
	if err != nil {
		return nil, fmt.Errorf("take the lock %s (an abstract unix socket): %w", HostLockName, err)
	}
	l := &netnsLock{ln: ln, done: make(chan struct{})}
	// Whoever connects is only asking who holds the lock: the answer is in
	// the socket's peer credentials, so each connection is closed at once.
	go func() {
		defer close(l.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(100 * time.Millisecond) // out of descriptors: no busy loop
				continue
			}
			c.Close()
		}
	}()
	return l, nil
}

// release drops the lock. Safe on nil.
func (l *netnsLock) release() {
	if l == nil {
		return
	}
	_ = l.ln.Close()
	<-l.done
}

// lockHolder names the process holding HostLockName in ns: "pid N
// (comm)" from the socket's peer credentials, "pid unknown" if they
// cannot be had (a process of another PID namespace shows as pid 0).
func lockHolder(ns netns.NsHandle) string {
	var cred *unix.Ucred
	_ = inNetns(ns, func() error {
		c, err := net.DialTimeout("unix", HostLockName, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.(*net.UnixConn).SyscallConn()
		if err != nil {
			return err
		}
		return raw.Control(func(fd uintptr) {
			cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		})
	})
	if cred == nil || cred.Pid == 0 {
		return "pid unknown"
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cred.Pid))
	if err != nil {
		return fmt.Sprintf("pid %d", cred.Pid)
	}
	return fmt.Sprintf("pid %d (%s)", cred.Pid, strings.TrimSpace(string(comm)))
}

// inNetns runs fn on a thread in network namespace ns (closed: the
// calling thread's namespace, where fn just runs). Sockets fn opens stay
// in ns. The thread is switched back after fn; if it cannot be, it is
// left locked and so ends with its goroutine, never running other code
// in ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("open this thread's network namespace: %w", err)
			return // thread left locked: it ends with this goroutine
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
