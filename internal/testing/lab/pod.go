package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// Pod is a network namespace attached to its host's overlay network through
// libcni, the way a container runtime attaches a pod: the project's conflist
// with overlay-cni delegating to the real bridge and host-local plugins. It
// runs a Responder on ProbePort.
type Pod struct {
	Name        string // e.g. "p1"
	NSName      string // e.g. "ovl1234-h1-p1"
	ContainerID string
	NS          netns.NsHandle
	IP          netip.Addr
	IPv6        netip.Addr // zero unless the network carries IPv6
	Node        *Node

	rt         *libcni.RuntimeConf
	responders []*Responder
	once       sync.Once
	delErr     error
}

// confList is the project's conflist adapted to this host: its subnet.env,
// and overlay-cni's cache and host-local's reservations in the host's
// directory, so nothing writes /var/lib/cni.
func (n *Node) confList() (*libcni.NetworkConfigList, error) {
	var list map[string]any
	if err := json.Unmarshal(n.lab.conflist, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", n.lab.cfg.ConfList, err)
	}
	plugins, _ := list["plugins"].([]any)
	var overlay map[string]any
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "overlay-cni" {
			overlay = m
		}
	}
	if overlay == nil {
		return nil, fmt.Errorf("%s has no overlay-cni plugin", n.lab.cfg.ConfList)
	}
	if n.NetworkName != "" {
		list["name"] = n.NetworkName
	}
	if n.FlannelDataDir != "" {
		overlay["flannelDataDir"] = n.FlannelDataDir
	}
	overlay["subnetFile"] = n.SubnetFile
	overlay["dataDir"] = filepath.Join(n.Dir, "cni-cache")
	ipam, _ := overlay["ipam"].(map[string]any)
	if ipam == nil {
		ipam = map[string]any{}
	}
	ipam["dataDir"] = filepath.Join(n.Dir, "ipam")
	overlay["ipam"] = ipam
	raw, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(raw)
}

// AddPod creates pod name on n: a namespace, CNI ADD run inside the host's
// namespace (so the plugins, exec'd from there, build cni0 and the veth
// there), and a Responder on the pod's address. overlayd must have written
// subnet.env (WaitReady).
func (n *Node) AddPod(ctx context.Context, name string) (*Pod, error) {
	list, err := n.confList()
	if err != nil {
		return nil, err
	}
	return n.AddPodWith(ctx, name, list)
}

// AddPodWith is AddPod with the CNI config list list, e.g. one a previous
// network plugin used (Delete still goes through the project's conflist,
// as a runtime's DEL does once the host's conflist changed).
func (n *Node) AddPodWith(ctx context.Context, name string, list *libcni.NetworkConfigList) (_ *Pod, err error) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%s is closed", n.Name)
	}
	p := &Pod{Name: name, NSName: n.NSName + "-" + name, Node: n}
	p.ContainerID = p.NSName
	_ = netns.DeleteNamed(p.NSName) // a leftover of this same process
	if p.NS, err = newNamedNS(p.NSName); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.NS.Close()
			_ = netns.DeleteNamed(p.NSName)
		}
	}()
	if err := linkUp(p.NS, "lo"); err != nil {
		return nil, fmt.Errorf("pod %s: %w", p.NSName, err)
	}
	p.rt = &libcni.RuntimeConf{ContainerID: p.ContainerID, NetNS: filepath.Join(netnsDir, p.NSName), IfName: "eth0"}
	var res *types100.Result
	err = Do(n.NS, func() error {
		r, err := n.lab.cni.AddNetworkList(ctx, list, p.rt)
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	})
	if err != nil {
		// Release whatever the ADD got (the runtime would DEL too).
		_ = Do(n.NS, func() error { return n.lab.cni.DelNetworkList(context.WithoutCancel(ctx), list, p.rt) })
		return nil, fmt.Errorf("CNI ADD of pod %s on %s: %w", name, n.Name, err)
	}
	for _, ipc := range res.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		switch a = a.Unmap(); {
		case a.Is4() && !p.IP.IsValid():
			p.IP = a
		case a.Is6() && !p.IPv6.IsValid():
			p.IPv6 = a
		}
	}
	if err := p.serve(ctx); err != nil {
		_ = Do(n.NS, func() error { return n.lab.cni.DelNetworkList(context.WithoutCancel(ctx), list, p.rt) })
		return nil, fmt.Errorf("pod %s: %w (CNI result %v)", p.NSName, err, res)
	}
	n.mu.Lock()
	n.pods = append(n.pods, p)
	n.mu.Unlock()
	return p, nil
}

// Delete stops the pod's responder, runs CNI DEL (inside the host's
// namespace) and deletes the pod's namespace. Safe to call twice.
func (p *Pod) Delete(ctx context.Context) error {
	p.once.Do(func() {
		n := p.Node
		var errs []error
		for _, r := range p.responders {
			r.Close()
		}
		list, err := n.confList()
		if err == nil {
			err = Do(n.NS, func() error { return n.lab.cni.DelNetworkList(ctx, list, p.rt) })
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL of pod %s on %s: %w", p.Name, n.Name, err))
		}
		p.NS.Close()
		if err := netns.DeleteNamed(p.NSName); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", p.NSName, err))
		}
		n.mu.Lock()
		n.pods = slices.DeleteFunc(n.pods, func(x *Pod) bool { return x == p })
		n.mu.Unlock()
		p.delErr = errors.Join(errs...)
	})
	return p.delErr
}

// String is "h1/p1 (10.244.7.2)", or with the IPv6 address on an
// IPv6-only host.
func (p *Pod) String() string {
	addr := p.IP
	if !addr.IsValid() {
		addr = p.IPv6
	}
	return fmt.Sprintf("%s/%s (%s)", p.Node.Name, p.Name, addr)
}

// serve starts a Responder on each of the pod's addresses. An IPv6 address
// can be bound only once duplicate address detection is done: that is
// waited for.
func (p *Pod) serve(ctx context.Context) error {
	if !p.IP.IsValid() && !p.IPv6.IsValid() {
		return errors.New("CNI ADD gave no address")
	}
	if p.IPv6.IsValid() {
		if err := waitNotTentative(ctx, p.NS, p.IPv6); err != nil {
			return err
		}
	}
	for _, a := range []netip.Addr{p.IP, p.IPv6} {
		if !a.IsValid() {
			continue
		}
		r, err := Serve(p.NS, a, ProbePort)
		if err != nil {
			return err
		}
		p.responders = append(p.responders, r)
	}
	return nil
}

// waitNotTentative polls ns until addr is there and usable (bounded: DAD
// takes about a second).
func waitNotTentative(ctx context.Context, ns netns.NsHandle, addr netip.Addr) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	deadline := time.Now().Add(testenv.Deadline(10 * time.Second))
	for {
		addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if ip, _ := netip.AddrFromSlice(a.IP); ip == addr && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("address %s still tentative (duplicate address detection)", addr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// linkUp brings up link name in ns.
func linkUp(ns netns.NsHandle, name string) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(link)
}
