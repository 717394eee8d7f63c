package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/subnet"
)

// Kernel is the host's network stack as the daemon uses it: the one seam
// between the daemon's wiring and the kernel. Run uses the real one in
// Config.NetNS unless Config.Kernel says otherwise; the wiring tests give
// it a fake, so start-up, hand-offs, readiness and shutdown are tested
// without root.
type Kernel interface {
	// Underlay finds the interface and public addresses to use (--iface,
	// --public-ip, --public-ipv6, or the default route's link).
	Underlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error)
	// ChooseUnderlay resolves the underlay flags (see
	// Config.ChooseUnderlay): the command line's choice, checked once.
	ChooseUnderlay(f UnderlayFlags) (UnderlayChoice, error)
	// Plane builds one data plane (one address family's, of the
	// network's backend) as spec says, with the function that releases
	// what it holds (its netlink sockets). It touches nothing yet: the
	// daemon calls the plane's EnsureDevice, AdoptRoutes, Run, and
	// `overlayd teardown` its Teardown.
	Plane(spec PlaneSpec) (backend.Plane, func(), error)
	// TeardownUnderlay finds the underlay as far as teardown needs it:
	// like Underlay, but a link that is down, has no address or no
	// default route will do (a host being taken apart may have lost
	// them). The error says why no link was found; what else was found
	// is returned all the same. An error wrapping errNoNetlink says the
	// kernel cannot be reached at all.
	TeardownUnderlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error)
	// Masquerade installs the masquerade of traffic from each cluster
	// network (one per address family) to outside it and returns what
	// keeps it in place.
	Masquerade(networks []masq.Network, log *slog.Logger) (Masquerader, error)
	// RemoveMasquerade deletes overlayd's masquerade table (and the
	// table of older versions), and reports whether there was one.
	RemoveMasquerade() (bool, error)
	// Guard builds the VXLAN guard of family fam for the VXLAN UDP port
	// port, which the plane of that family drives (PlaneSpec.Gate). It
	// touches nothing until the plane's first pass.
	Guard(fam backend.Family, port int, log *slog.Logger) (Guard, error)
	// RemoveGuard deletes the VXLAN guard's table (both families), and
	// reports whether there was one.
	RemoveGuard() (bool, error)
	// RemoveGuardFamily deletes the VXLAN guard's set and chain of family
	// fam, leaving the other family's, and reports whether there were any.
	RemoveGuardFamily(fam backend.Family) (bool, error)
	// LinkMAC returns the MAC of the link called name, if there is one.
	LinkMAC(name string) (mac net.HardwareAddr, ok bool, err error)
	// LinkAddrs returns the addresses of the link called name (none if
	// there is no such link).
	LinkAddrs(name string) ([]netip.Prefix, error)
	// MarkTakenOver records on flanneld's device name that overlayd has
	// taken it over (see TakenOverAlias).
	MarkTakenOver(name string) error
	// TakenOver reports whether overlayd took flanneld's device name of
	// family fam over, and it is overlayd's to remove: it carries
	// TakenOverAlias, or routes of overlayd's (a device taken over by a
	// version that did not mark it, or re-created since).
	TakenOver(name string, fam backend.Family) bool
	// LockHost takes this host's one-overlayd lock (HostLockName) without
	// waiting, and returns what releases it; ErrRunning, naming the
	// holder, if it is held.
	LockHost() (release func(), err error)
	// CheckDataPath says, before anything is claimed in etcd, whether the
	// data path p can be built here: ErrNoNetAdmin, ErrPortInUse (naming
	// the holder), or nil.
	CheckDataPath(p DataPath) error
	// Pinger opens the ICMP socket that probes the peers of fam from
	// this host's VTEP address src (peerhealth.Open), and says which
	// kind of socket it is.
	Pinger(fam backend.Family, src netip.Addr) (peerhealth.Pinger, string, error)
}

// TakenOverAlias is the alias (IFLA_IFALIAS, `ip link show` prints it)
// overlayd gives a device of flanneld's it takes over: it says, on the
// device itself, that the device is overlayd's now, so that teardown
// removes it even when it carries none of overlayd's routes (a host with
// no peer, or whose peers are gone).
const TakenOverAlias = "overlayd: taken over from flanneld"

// Masquerader keeps the masquerade in place until ctx ends (Run); Close
// releases it and leaves the rules installed. RemoveFlannel deletes the
// masquerade flanneld left (see masq.Masq.RemoveFlannel).
type Masquerader interface {
	Run(ctx context.Context) error
	Close() error
	RemoveFlannel() ([]string, error)
}

// Guard is one family's VXLAN guard as the daemon holds it: the plane
// drives it as its backend.Gate; the metrics read its drop count; Close
// releases it and leaves its table in place (a restart adopts it).
type Guard interface {
	backend.Gate
	Family() backend.Family
	Dropped() (uint64, error)
	// Repairs counts what the guard put back after something else
	// changed its table (guard.Gate.Repairs).
	Repairs() uint64
	// Refused are the sources of the datagrams the guard dropped lately
	// (guard.RefusedTimeout), sorted.
	Refused() ([]netip.Addr, error)
	Close() error
}

// hostKernel is the real Kernel, in namespace ns (closed: the process's).
type hostKernel struct{ ns netns.NsHandle }

func (k hostKernel) Underlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return Underlay{}, err
	}
	defer h.Close()
	return DetectUnderlay(h, iface, publicIP, publicIPv6)
}

func (k hostKernel) Plane(spec PlaneSpec) (backend.Plane, func(), error) {
	if spec.Backend.Type != "" && spec.Backend.Type != subnet.DefaultBackendType {
		// ParseConfig refuses any other type: a new backend is one more case here.
		return nil, nil, fmt.Errorf("no data plane of backend type %q", spec.Backend.Type)
	}
	nl, err := vxlan.OpenNetlink(k.ns)
	if err != nil {
		return nil, nil, err
	}
	be, err := vxlan.New(spec.vxlanConfig(), nl)
	if err != nil {
		_ = nl.Close()
		return nil, nil, err
	}
	return be, func() { _ = nl.Close() }, nil
}

func (k hostKernel) Pinger(fam backend.Family, src netip.Addr) (pg peerhealth.Pinger, kind string, err error) {
	err = inNetns(k.ns, func() error {
		pg, kind, err = peerhealth.Open(fam, src)
		return err
	})
	return pg, kind, err
}

func (k hostKernel) TeardownUnderlay(iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return Underlay{PublicIP: publicIP, PublicIPv6: publicIPv6}, err
	}
	defer h.Close()
	return teardownUnderlay(h, iface, publicIP, publicIPv6)
}

func (k hostKernel) TakenOver(name string, fam backend.Family) bool {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return false
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return false
	}
	if link.Attrs().Alias == TakenOverAlias {
		return true
	}
	family := unix.AF_INET
	if fam == backend.IPv6 {
		family = unix.AF_INET6
	}
	routes, err := h.RouteListFiltered(family, &netlink.Route{LinkIndex: link.Attrs().Index, Protocol: vxlan.RouteProtocol},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	return err == nil && len(routes) > 0
}

func (k hostKernel) LockHost() (func(), error) {
	l, err := lockNetns(k.ns)
	if err != nil {
		return nil, err
	}
	return l.release, nil
}

func (k hostKernel) LinkMAC(name string) (net.HardwareAddr, bool, error) {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return nil, false, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("look up %s: %w", name, err)
	}
	return l.Attrs().HardwareAddr, true, nil
}

func (k hostKernel) LinkAddrs(name string) ([]netip.Prefix, error) {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		bits, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), bits))
	}
	return out, nil
}

func (k hostKernel) MarkTakenOver(name string) error {
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if l.Attrs().Alias == TakenOverAlias {
		return nil
	}
	if err := h.LinkSetAlias(l, TakenOverAlias); err != nil {
		return fmt.Errorf("set the alias of %s: %w", name, err)
	}
	return nil
}

// masqInterval is how often the masquerade table is checked and repaired.
const masqInterval = 30 * time.Second

func (k hostKernel) Masquerade(networks []masq.Network, log *slog.Logger) (Masquerader, error) {
	opts := []masq.Option{masq.WithLogger(log)}
	if k.ns.IsOpen() {
		opts = append(opts, masq.WithNetNS(k.ns))
	}
	mq, err := masq.NewNetworks(networks, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := mq.Ensure(); err != nil {
		mq.Close()
		return nil, fmt.Errorf("--ip-masq: install the nftables table %q: %w (does the kernel have nf_tables with NAT? use --ip-masq=false to masquerade elsewhere)", masq.TableName, err)
	}
	if drops, err := mq.ForwardDrops(); err == nil && len(drops) > 0 {
		log.Warn("forward chains with policy drop exist; they drop pod traffic unless they accept the cluster networks: add that accept there",
			"chains", drops, "networks", mq.Networks())
	}
	return keptMasq{mq}, nil
}

func (k hostKernel) RemoveMasquerade() (bool, error) { return removeMasq(k.ns) }

func (k hostKernel) Guard(fam backend.Family, port int, log *slog.Logger) (Guard, error) {
	opts := []guard.Option{guard.WithLogger(log)}
	if k.ns.IsOpen() {
		opts = append(opts, guard.WithNetNS(k.ns))
	}
	g, err := guard.New(fam, port, opts...)
	if err != nil {
		return nil, fmt.Errorf("--vxlan-guard: %w", err)
	}
	return g, nil
}

func (k hostKernel) RemoveGuard() (bool, error) { return guard.Remove(k.ns) }

func (k hostKernel) RemoveGuardFamily(fam backend.Family) (bool, error) {
	return guard.RemoveFamily(k.ns, fam)
}

type keptMasq struct{ *masq.Masq }

func (m keptMasq) Run(ctx context.Context) error { return m.Masq.Run(ctx, masqInterval, nil) }

// netlinkHandle opens a netlink handle in ns (or the current namespace).
// errNoNetlink is why nothing of the host's kernel can be read or
// changed: its netlink could not be opened. Teardown stops on it at once
// rather than go on to etcd with a kernel it cannot touch.
var errNoNetlink = errors.New("open netlink")

func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoNetlink, err)
	}
	return h, nil
}
