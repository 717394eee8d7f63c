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

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
	Node        *Node

	rt        *libcni.RuntimeConf
	responder *Responder
	once      sync.Once
	delErr    error
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
func (n *Node) AddPod(ctx context.Context, name string) (_ *Pod, err error) {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%s is closed", n.Name)
	}
	list, err := n.confList()
	if err != nil {
		return nil, err
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
		if v4 := ipc.Address.IP.To4(); v4 != nil {
			p.IP, _ = netip.AddrFromSlice(v4)
			break
		}
	}
	if !p.IP.IsValid() {
		_ = Do(n.NS, func() error { return n.lab.cni.DelNetworkList(context.WithoutCancel(ctx), list, p.rt) })
		return nil, fmt.Errorf("CNI ADD of pod %s on %s gave no IPv4 address: %v", name, n.Name, res)
	}
	if p.responder, err = Serve(p.NS, p.IP, ProbePort); err != nil {
		_ = Do(n.NS, func() error { return n.lab.cni.DelNetworkList(context.WithoutCancel(ctx), list, p.rt) })
		return nil, fmt.Errorf("pod %s: %w", p.NSName, err)
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
		if p.responder != nil {
			p.responder.Close()
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

// String is "h1/p1 (10.244.7.2)".
func (p *Pod) String() string { return fmt.Sprintf("%s/%s (%s)", p.Node.Name, p.Name, p.IP) }

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
