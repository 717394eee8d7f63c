package delegate

import (
	"encoding/json"
	"net/netip"

	"github.com/overlaynet/overlay/subnet"
)

// Delegate is a rendered delegate configuration: what overlay-cni hands to
// the delegate plugin on stdin, and what the cache stores for DEL.
type Delegate struct {
	// Type is the delegate plugin to run (the config's "type").
	Type string
	// Lease is the host's lease the configuration was rendered from, and
	// IPv6Lease its IPv6 lease on a dual-stack host (else zero).
	Lease     netip.Prefix
	IPv6Lease netip.Prefix
	// Config is the delegate's network configuration, compact JSON with
	// sorted keys.
	Config []byte
}

// legacyRangeKeys are host-local's old single-range keys. host-local
// prepends such a range to "ranges", so they are dropped from the ipam base:
// the only range is ever the lease.
var legacyRangeKeys = []string{"subnet", "rangeStart", "rangeEnd", "gateway"}

// podRoutes are the pod's routes: to each cluster network, then the
// user's (duplicates dropped), each of a family the host has a lease of.
func podRoutes(c *NetConf, networks []netip.Prefix, lease, lease6 netip.Prefix) ([]json.RawMessage, error) {
	userRoutes, err := ipamRoutes(c.IPAM)
	if err != nil {
		return nil, err
	}
	var routes []json.RawMessage
	seen := map[string]bool{}
	for _, n := range networks {
		dst, _ := json.Marshal(map[string]string{"dst": n.String()}) // cannot fail: strings
		routes = append(routes, dst)
		seen[n.String()+" via "] = true
	}
	for i, r := range userRoutes {
		own := lease6
		if r.dst.Addr().Is4() {
			own = lease
		}
		if !own.IsValid() {
			return nil, invalidf("ipam.routes[%d].dst %s: this host has no lease of its address family (OVERLAY_IPV6_SUBNET or OVERLAY_SUBNET is absent), so a pod has no source address to route it from", i, r.dst)
		}
		key := r.dst.String() + " via " + r.gw
		if seen[key] {
			continue
		}
		seen[key] = true
		routes = append(routes, r.raw)
	}
	return routes, nil
}

// Render builds the delegate configuration for the host's lease
// (DESIGN.md §7):
//
//   - the user's delegate keys, then the defaults for the keys the user did
//     not set: bridge "cni0", mtu = OVERLAY_MTU, ipMasq = !OVERLAY_IPMASQ
//     (overlayd masquerades itself when OVERLAY_IPMASQ is true),
//     isGateway true (the bridge holds the lease's first address, the pods'
//     gateway) and forceAddress true (bridge replaces the gateway address
//     of an earlier lease instead of failing every ADD);
//   - always ours: name, cniVersion, type (delegate.type, default bridge);
//   - ipam: the user's ipam base with type host-local, ranges = the lease
//     (and on a dual-stack host a second range set, the IPv6 lease, so a
//     pod gets an address of each family; on an IPv6-only host the IPv6
//     lease alone) and routes = the cluster network(s) first, then the
//     user's routes (duplicates dropped);
//   - runtimeConfig and args as the runtime gave them.
//
// Render is pure: the same inputs always give the same bytes.
func Render(c *NetConf, env subnet.Env) (Delegate, error) {
	if err := env.Validate(); err != nil {
		return Delegate{}, err
	}
	lease, lease6 := env.Lease(), env.IPv6Lease()
	var networks []netip.Prefix
	var ranges [][]map[string]string
	if lease.IsValid() {
		networks = append(networks, env.Network.Masked())
		ranges = append(ranges, []map[string]string{{"subnet": lease.String()}})
	}
	if lease6.IsValid() {
		networks = append(networks, env.IPv6Network.Masked())
		ranges = append(ranges, []map[string]string{{"subnet": lease6.String()}})
	}

	// enc encodes one value; only a malformed raw value (never produced by
	// ParseConf) can fail, and the first failure is reported below.
	var encErr error
	enc := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil && encErr == nil {
			encErr = err
		}
		return b
	}

	out := make(map[string]json.RawMessage, len(c.Delegate)+8)
	for k, v := range c.Delegate {
		out[k] = v
	}
	setDefault := func(k string, v any) {
		if _, ok := out[k]; !ok {
			out[k] = enc(v)
		}
	}
	setDefault("bridge", DefaultBridge)
	setDefault("mtu", env.MTU)
	setDefault("ipMasq", !env.IPMasq)
	setDefault("isGateway", true)
	// After a lease change cni0 still holds the old lease's gateway, and
	// bridge refuses to add the new one unless told to replace it.
	setDefault("forceAddress", true)
	out["type"] = enc(c.DelegateType)
	out["name"] = enc(c.Name)
	out["cniVersion"] = enc(c.CNIVersion)

	ipam := make(map[string]json.RawMessage, len(c.IPAM)+3)
	for k, v := range c.IPAM {
		ipam[k] = v
	}
	for _, k := range legacyRangeKeys {
		delete(ipam, k)
	}
	ipam["type"] = enc("host-local")
	ipam["ranges"] = enc(ranges)
	routes, err := podRoutes(c, networks, lease, lease6)
	if err != nil {
		return Delegate{}, err
	}
	ipam["routes"] = enc(routes)
	out["ipam"] = enc(ipam)

	if c.RuntimeConfig != nil {
		out["runtimeConfig"] = c.RuntimeConfig
	}
	if c.Args != nil {
		out["args"] = c.Args
	}
	data := enc(out)
	if encErr != nil {
		return Delegate{}, invalidf("cannot encode the delegate configuration: %v", encErr)
	}
	return Delegate{Type: c.DelegateType, Lease: lease, IPv6Lease: lease6, Config: data}, nil
}
