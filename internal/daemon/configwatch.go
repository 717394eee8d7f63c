package daemon

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/overlaynet/overlay/subnet"
)

// configWatch judges each change of <prefix>/config against the config the
// daemon runs with: the device, subnet.env and the peers' validation all
// follow the config read at start, so a stored config that differs in
// what they use needs a restart, and one whose network no longer holds
// this host's lease strands it. Turning IPv6 on or off alone is the
// exception: it is rolled host by host while every host keeps carrying
// IPv4, so it is reported as pending, not as a readiness failure.
type configWatch struct {
	running *subnet.Config
	lease   subnet.Subnets
	key     string
	// public are this host's underlay addresses (zero if it has none of
	// a family): a stored network that holds one is named as the problem.
	public []netip.Addr
	log    *slog.Logger
	last   string // the reason last reported, to log each change once
}

// update returns the readiness reason for the stored config u ("" if it
// fits) and, for a change this host applies at its next start while it
// keeps carrying traffic (EnableIPv6 turned on or off), what is pending;
// it logs a change of either once.
func (w *configWatch) update(u subnet.ConfigUpdate) (reason, pending string) {
	problem := ""
	if u.Err != nil {
		problem = u.Err.Error()
	} else if h := holdsUnderlay(u.Config, w.public); h != "" {
		problem = w.key + ": " + h
	} else if d := configDrift(w.running, u.Config, w.lease); d != "" {
		problem = w.key + ": " + d
	} else {
		pending = ipv6Toggled(w.running, u.Config, w.key)
	}
	switch now := problem + pending; {
	case now == w.last:
	case pending != "":
		w.log.Warn("network config changed while running; restart overlayd on this host to apply it", "pending", pending)
	case problem == "":
		w.log.Info("network config matches the running one again")
	default:
		w.log.Warn("network config changed while running", "problem", problem)
	}
	w.last = problem + pending
	if problem == "" {
		return "", pending
	}
	return "network config changed while running: " + problem, ""
}

// ipv6Toggled says what this host does until it restarts, when the stored
// config now differs from the running one run only in carrying IPv6 or not
// (both carrying IPv4; configDrift found nothing else): "" otherwise. That
// change is rolled host by host (Documentation/configuration.md), and
// meanwhile this host's IPv4 data path is whole — hosts program the IPv4
// half of each other's keys (subnet.Config.IPv4Only) — so it stays ready.
func ipv6Toggled(run, now *subnet.Config, key string) string {
	switch {
	case run.EnableIPv6 == now.EnableIPv6:
		return ""
	case now.EnableIPv6:
		return fmt.Sprintf("EnableIPv6 false -> true in %s: this host carries IPv4 only until overlayd restarts here (its lease then gains an IPv6 subnet of %s); restart overlayd host by host", key, now.IPv6.Network)
	}
	return fmt.Sprintf("EnableIPv6 true -> false in %s: this host keeps its IPv6 device until overlayd restarts here (which removes it and drops its lease's IPv6 subnet); restart overlayd host by host", key)
}

// holdsUnderlay says which of now's networks holds one of this host's
// underlay addresses, and what to do; "" if none does.
func holdsUnderlay(now *subnet.Config, public []netip.Addr) string {
	for _, ip := range public {
		if n := now.NetworkHolding(ip); ip.IsValid() && n != "" {
			return fmt.Sprintf("%s holds this host's public address %s: every host would skip this host's lease under it, and overlayd refuses to start under it. Restore the previous config (`overlayd config put -f old.json`)", n, ip)
		}
	}
	return ""
}

// configDrift says how now differs from run in what a running daemon uses,
// and what to do; "" if it does not.
func configDrift(run, now *subnet.Config, lease subnet.Subnets) string {
	const fix = "Restore the previous config (`overlayd config put -f old.json`), or drain this host, run `overlayd teardown` and start overlayd again to lease a subnet of the new network"
	if run.EnableIPv4 != now.EnableIPv4 {
		// An IPv6-only network keeps its leases under subnets6/: no lease carries over.
		return fmt.Sprintf("EnableIPv4 %v -> %v: this host's lease %s does not fit the new network. %s", run.EnableIPv4, now.EnableIPv4, lease, fix)
	}
	if lease.IPv4.IsValid() && !now.Contains(lease.IPv4) {
		return fmt.Sprintf("this host's lease %s is not a /%d inside Network %s: it is stranded. %s", lease.IPv4, now.SubnetLen, now.Network, fix)
	}
	if lease.IPv6.IsValid() && now.EnableIPv6 && !now.IPv6.Contains(lease.IPv6) {
		return fmt.Sprintf("this host's lease %s is not a /%d inside IPv6Network %s: it is stranded. %s", lease.IPv6, now.IPv6.SubnetLen, now.IPv6.Network, fix)
	}
	var diffs []string
	diff := func(field string, a, b any) {
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s %v -> %v", field, a, b))
		}
	}
	diff("Network", run.Network, now.Network)
	diff("SubnetLen", run.SubnetLen, now.SubnetLen)
	diff("EnableIPv6", run.EnableIPv6, now.EnableIPv6)
	if run.EnableIPv6 && now.EnableIPv6 {
		diff("IPv6Network", run.IPv6.Network, now.IPv6.Network)
		diff("IPv6SubnetLen", run.IPv6.SubnetLen, now.IPv6.SubnetLen)
	}
	diff("Backend.VNI", run.Backend.VNI, now.Backend.VNI)
	diff("Backend.Port", run.Backend.Port, now.Backend.Port)
	diff("Backend.MTU", run.Backend.MTU, now.Backend.MTU)
	diff("Backend.DirectRouting", run.Backend.DirectRouting, now.Backend.DirectRouting)
	if len(diffs) == 0 || len(diffs) == 1 && run.EnableIPv6 != now.EnableIPv6 {
		return "" // nothing, or an IPv6 toggle: see ipv6Toggled
	}
	return strings.Join(diffs, ", ") + ": the running device and subnet.env use the old values; restart overlayd on every host to apply the change, or restore the previous config"
}
