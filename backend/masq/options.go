package masq

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"
)

// Option configures New.
type Option func(*options) error

type options struct {
	networks []netip.Prefix // besides New's
	ns       netns.NsHandle
	nsSet    bool
	device4  string
	device6  string
	timeout  time.Duration
	log      *slog.Logger
}

// WithNetwork adds the cluster network of the other address family, for a
// dual-stack cluster: New(10.244.0.0/16, WithNetwork(fd00:10:244::/48))
// masquerades both. A second network of New's family is an error.
func WithNetwork(p netip.Prefix) Option {
	return func(o *options) error {
		o.networks = append(o.networks, p)
		return nil
	}
}

// WithNetNS programs the network namespace ns instead of the one the calling
// thread of New is in. Masq keeps its own duplicate of the handle; the
// caller may close ns.
func WithNetNS(ns netns.NsHandle) Option {
	return func(o *options) error {
		if !ns.IsOpen() {
			return fmt.Errorf("network namespace handle %d is not open: %w", int(ns), ErrInvalidConfig)
		}
		o.ns, o.nsSet = ns, true
		return nil
	}
}

// WithOverlayDevice names the VXLAN device of the IPv4 network (e.g.
// "overlay.1") and adds the rule that masquerades traffic from outside the
// cluster network leaving through it to pods on other hosts (see the package
// documentation). It needs an IPv4 cluster network.
func WithOverlayDevice(name string) Option {
	return deviceOption(name, "overlay device", func(o *options) *string { return &o.device4 })
}

// WithIPv6OverlayDevice is WithOverlayDevice for the IPv6 network's VXLAN
// device (e.g. "overlay-v6.1"). It needs an IPv6 cluster network.
func WithIPv6OverlayDevice(name string) Option {
	return deviceOption(name, "IPv6 overlay device", func(o *options) *string { return &o.device6 })
}

func deviceOption(name, what string, field func(*options) *string) Option {
	return func(o *options) error {
		if err := validDeviceName(name); err != nil {
			return fmt.Errorf("%s: %w: %w", what, err, ErrInvalidConfig)
		}
		*field(o) = name
		return nil
	}
}

// WithTimeout bounds each netlink operation (default DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("timeout %v is not positive: %w", d, ErrInvalidConfig)
		}
		o.timeout = d
		return nil
	}
}

// WithLogger sets the logger Run reports through (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		o.log = l
		return nil
	}
}
