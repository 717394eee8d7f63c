package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// OpenNetlink opens the netlink the VXLAN backend programs through,
	// with the function that closes it.
	OpenNetlink() (vxlan.Netlink, func(), error)
	// Masquerade installs the masquerade of traffic from each cluster
	// network (one per address family) to outside it and returns what
	// keeps it in place.
	Masquerade(networks []MasqNetwork, log *slog.Logger) (Masquerader, error)
}

// MasqNetwork is a cluster network and its VXLAN device.
type MasqNetwork struct {
	Network netip.Prefix
	Device  string
}

// Masquerader keeps the masquerade in place until ctx ends (Run); Close
// releases it and leaves the rules installed.
type Masquerader interface {
	Run(ctx context.Context) error
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

func (k hostKernel) OpenNetlink() (vxlan.Netlink, func(), error) {
	nl, err := vxlan.OpenNetlink(k.ns)
	if err != nil {
		return nil, nil, err
	}
	return nl, func() { _ = nl.Close() }, nil
}

// masqInterval is how often the masquerade table is checked and repaired.
const masqInterval = 30 * time.Second

func (k hostKernel) Masquerade(networks []MasqNetwork, log *slog.Logger) (Masquerader, error) {
	if len(networks) == 0 {
		return nil, errors.New("--ip-masq: no cluster network to masquerade")
	}
	opts := []masq.Option{masq.WithLogger(log)}
	var all []netip.Prefix
	for _, n := range networks {
		all = append(all, n.Network)
		if n.Network.Addr().Is4() {
			opts = append(opts, masq.WithOverlayDevice(n.Device))
		} else {
			opts = append(opts, masq.WithIPv6OverlayDevice(n.Device))
		}
	}
	for _, p := range all[1:] {
		opts = append(opts, masq.WithNetwork(p))
	}
	if k.ns.IsOpen() {
		opts = append(opts, masq.WithNetNS(k.ns))
	}
	mq, err := masq.New(all[0], opts...)
	if err != nil {
		return nil, err
	}
	if _, err := mq.Ensure(); err != nil {
		mq.Close()
		return nil, fmt.Errorf("--ip-masq: install the nftables table %q: %w (does the kernel have nf_tables with NAT? use --ip-masq=false to masquerade elsewhere)", masq.TableName, err)
	}
	if drops, err := mq.ForwardDrops(); err == nil && len(drops) > 0 {
		log.Warn("forward chains with policy drop exist; they drop pod traffic unless they accept the cluster networks: add that accept there",
			"chains", drops, "networks", all)
	}
	return keptMasq{mq}, nil
}

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
