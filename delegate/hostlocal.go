package delegate

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// host-local's on-disk store (plugins/ipam/host-local/backend/disk): one
// directory per network holding a file per reserved address, named by the
// address and containing "<containerID>\r\n<ifname>" (older versions wrote
// only the container ID), a "last_reserved_ip.<range>" file per range, and a
// "lock" file that host-local flocks around every change.
const (
	hostLocalLockFile   = "lock"
	hostLocalLastPrefix = "last_reserved_ip."
	hostLocalLineBreak  = "\r\n"
)

// ValidSet is the set of attachments a runtime declared still valid.
type ValidSet struct {
	pairs map[[2]string]bool
	ids   map[string]bool
}

// NewValidSet builds the set from (containerID, ifname) pairs.
func NewValidSet(pairs [][2]string) ValidSet {
	v := ValidSet{pairs: map[[2]string]bool{}, ids: map[string]bool{}}
	for _, p := range pairs {
		v.pairs[p] = true
		v.ids[p[0]] = true
	}
	return v
}

// Has reports whether (containerID, ifname) is valid.
func (v ValidSet) Has(containerID, ifName string) bool {
	return v.pairs[[2]string{containerID, ifName}]
}

// HasContainer reports whether any attachment of containerID is valid
// (for reservations in the old format, which name no interface).
func (v ValidSet) HasContainer(containerID string) bool { return v.ids[containerID] }

// SweepHostLocal releases the host-local reservations in dir (one network's
// directory) whose attachment is not in valid, holding host-local's lock
// while it does so, and returns the released addresses. It never touches
// "lock", "last_reserved_ip.*", or a file it does not understand (a name
// that is not an address, an empty or unreadable reservation). It continues
// past errors and returns them joined. A missing directory sweeps nothing.
func SweepHostLocal(dir string, valid ValidSet) ([]netip.Addr, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	unlock, err := lockHostLocal(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list host-local directory: %w", err)
	}
	var released []netip.Addr
	var errs []error
	for _, de := range des {
		name := de.Name()
		if name == hostLocalLockFile || strings.HasPrefix(name, hostLocalLastPrefix) || !de.Type().IsRegular() {
			continue
		}
		addr, err := netip.ParseAddr(name)
		if err != nil {
			continue
		}
		p := filepath.Join(dir, name)
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read host-local reservation: %w", err))
			continue
		}
		content := strings.TrimSpace(string(data))
		if content == "" {
			continue
		}
		id, ifName, hasIf := strings.Cut(content, hostLocalLineBreak)
		id = strings.TrimSpace(id)
		if (hasIf && valid.Has(id, strings.TrimSpace(ifName))) || (!hasIf && valid.HasContainer(id)) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("release host-local reservation: %w", err))
			continue
		}
		released = append(released, addr)
	}
	return released, errors.Join(errs...)
}

// lockHostLocal takes host-local's lock on dir (an exclusive flock on
// dir/lock, as its go-filemutex does) and returns the function releasing it.
func lockHostLocal(dir string) (func(), error) {
	p := filepath.Join(dir, hostLocalLockFile)
	// O_NOFOLLOW: a symbolic link named lock is never followed, so a
	// dangling one cannot make GC create a file elsewhere; O_NONBLOCK: a
	// FIFO named lock does not block the open (flock then fails on it).
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open host-local lock: %w", err)
	}
	// Go installs its signal handlers with SA_RESTART, so flock is not cut
	// short by EINTR.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock host-local directory %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}
