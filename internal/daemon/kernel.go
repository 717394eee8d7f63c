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

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
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
	// OpenNetlink opens the netlink the VXLAN backend programs through,
	// with the function that closes it.
	OpenNetlink() (vxlan.Netlink, func(), error)
	// Masquerade installs the masquerade of traffic from each cluster
	// network (one per address family) to outside it and returns what
	// keeps it in place.
	Masquerade(networks []masq.Network, log *slog.Logger) (Masquerader, error)
	// RemoveMasquerade deletes overlayd's masquerade table (and the
	// table of older versions), and reports whether there was one.
	RemoveMasquerade() (bool, error)
	// LinkMAC returns the MAC of the link called name, if there is one.
	LinkMAC(name string) (mac net.HardwareAddr, ok bool, err error)
	// MarkTakenOver records on flanneld's device name that overlayd has
	// taken it over (see TakenOverAlias).
	MarkTakenOver(name string) error
	// LockHost takes this host's one-overlayd lock (HostLockName) without
	// waiting, and returns what releases it; ErrRunning, naming the
	// holder, if it is held.
	LockHost() (release func(), err error)
	// CheckDataPath says, before anything is claimed in etcd, whether the
	// data path p can be built here: ErrNoNetAdmin, ErrPortInUse (naming
	// the holder), or nil.
	CheckDataPath(p DataPath) error
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

func (k hostKernel) OpenNetlink() (vxlan.Netlink, func(), error) {
	nl, err := vxlan.OpenNetlink(k.ns)
	if err != nil {
		return nil, nil, err
	}
	return nl, func() { _ = nl.Close() }, nil
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

type keptMasq struct{ *masq.Masq }

func (m keptMasq) Run(ctx context.Context) error { return m.Masq.Run(ctx, masqInterval, nil) }

// netlinkHandle opens a netlink handle in ns (or the current namespace).
func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return h, nil
}
