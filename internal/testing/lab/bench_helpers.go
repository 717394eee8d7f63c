package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netns"
)

// Namespace is a bare named namespace of the lab's run (lo up, nothing
// else), for a caller that attaches it itself — e.g. a benchmark running
// CNI plugins by hand. Its name starts with the run prefix, so Close (and
// RemoveStale after a crash) deletes it with the rest of the lab.
type Namespace struct {
	Name string // e.g. "ovl1234-cni-h1-x3"
	Path string // /var/run/netns/<Name>, for CNI_NETNS
	NS   netns.NsHandle
}

// NewNamespace creates the namespace "<run><name>".
func (l *Lab) NewNamespace(name string) (*Namespace, error) {
	full := l.Run() + name
	_ = netns.DeleteNamed(full) // a leftover of this same process
	h, err := newNamedNS(full)
	if err != nil {
		return nil, err
	}
	if err := linkUp(h, "lo"); err != nil {
		h.Close()
		_ = netns.DeleteNamed(full)
		return nil, fmt.Errorf("namespace %s: %w", full, err)
	}
	return &Namespace{Name: full, Path: filepath.Join(netnsDir, full), NS: h}, nil
}

// Close deletes the namespace. Safe to call twice.
func (n *Namespace) Close() error {
	if n.NS.IsOpen() {
		n.NS.Close()
	}
	if err := netns.DeleteNamed(n.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete namespace %s: %w", n.Name, err)
	}
	return nil
}
