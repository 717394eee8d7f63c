package subnet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/internal/lib/atomicfile"
)

// DefaultEnvFile is where overlayd writes subnet.env and overlay-cni reads it.
const DefaultEnvFile = "/run/overlay/subnet.env"

// Env is the content of subnet.env (a contract, DESIGN.md §6): what the CNI
// plugin needs to know about this host's lease.
type Env struct {
	// Network is the whole cluster network (OVERLAY_NETWORK); zero in an
	// IPv6-only network.
	Network netip.Prefix
	// Subnet is the first usable address of the lease with the lease's prefix
	// length (OVERLAY_SUBNET), e.g. 10.244.7.1/24 for the lease 10.244.7.0/24;
	// zero in an IPv6-only network.
	Subnet netip.Prefix
	// MTU is the MTU pods should use (OVERLAY_MTU).
	MTU int
	// IPMasq tells whether overlayd masquerades traffic leaving the cluster
	// network itself (OVERLAY_IPMASQ), so the bridge plugin must not.
	IPMasq bool
	// IPv6Network and IPv6Subnet are the IPv6 counterparts of Network and
	// Subnet (OVERLAY_IPV6_NETWORK, OVERLAY_IPV6_SUBNET), in a network that
	// carries IPv6 only; both zero otherwise.
	IPv6Network netip.Prefix
	IPv6Subnet  netip.Prefix
}

// ErrEnvInvalid marks a subnet.env that exists but cannot be used.
var ErrEnvInvalid = errors.New("invalid subnet.env")

// NewEnv builds the Env for an IPv4 lease: OVERLAY_SUBNET is the lease's
// first usable address.
func NewEnv(network, lease netip.Prefix, mtu int, ipMasq bool) Env {
	return Env{Network: network, Subnet: firstUsable(lease), MTU: mtu, IPMasq: ipMasq}
}

// WithIPv6 adds the IPv6 network and lease of a host in a network that
// carries IPv6 (to an Env with no IPv4 keys in an IPv6-only one).
func (e Env) WithIPv6(network, lease netip.Prefix) Env {
	e.IPv6Network, e.IPv6Subnet = network, firstUsable(lease)
	return e
}

func firstUsable(lease netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(lease.Masked().Addr().Next(), lease.Bits())
}

// Lease returns the leased IPv4 subnet (the network address form of
// Subnet), or the zero Prefix.
func (e Env) Lease() netip.Prefix {
	if !e.Subnet.IsValid() {
		return netip.Prefix{}
	}
	return e.Subnet.Masked()
}

// IPv6Lease returns the leased IPv6 subnet, or the zero Prefix.
func (e Env) IPv6Lease() netip.Prefix {
	if !e.IPv6Subnet.IsValid() {
		return netip.Prefix{}
	}
	return e.IPv6Subnet.Masked()
}

// Validate reports whether the values are coherent: the IPv4 prefixes (but
// for an IPv6-only host) and the IPv6 ones, if given, of their family, each
// subnet inside its network, an MTU a link can carry.
func (e Env) Validate() error {
	v6 := e.IPv6Network.IsValid() || e.IPv6Subnet.IsValid()
	if e.Network.IsValid() || e.Subnet.IsValid() || !v6 {
		if err := checkEnvPair(ipv4, "OVERLAY_NETWORK", e.Network, "OVERLAY_SUBNET", e.Subnet); err != nil {
			return err
		}
	}
	if v6 {
		if err := checkEnvPair(ipv6, "OVERLAY_IPV6_NETWORK", e.IPv6Network, "OVERLAY_IPV6_SUBNET", e.IPv6Subnet); err != nil {
			return err
		}
	}
	if e.MTU < 576 || e.MTU > 65535 {
		return fmt.Errorf("%w: OVERLAY_MTU %d is outside 576..65535", ErrEnvInvalid, e.MTU)
	}
	return nil
}

// checkEnvPair checks a network and the subnet inside it, of family f.
func checkEnvPair(f family, networkKey string, network netip.Prefix, subnetKey string, subnet netip.Prefix) error {
	switch {
	case !network.IsValid() || !f.is(network.Addr()):
		return fmt.Errorf("%w: %s %q is not an %s prefix", ErrEnvInvalid, networkKey, network, f.name())
	case !subnet.IsValid() || !f.is(subnet.Addr()):
		return fmt.Errorf("%w: %s %q is not an %s prefix", ErrEnvInvalid, subnetKey, subnet, f.name())
	case subnet.Bits() < network.Bits() || !network.Contains(subnet.Addr()):
		return fmt.Errorf("%w: %s %s is not inside %s %s", ErrEnvInvalid, subnetKey, subnet, networkKey, network)
	}
	return nil
}

// Marshal renders the file in the contract's key order; the IPv6 keys, if
// any, come last, so an IPv4-only file is what it always was. An IPv6-only
// host's file has no IPv4 keys.
func (e Env) Marshal() []byte {
	var b []byte
	if e.Network.IsValid() {
		b = fmt.Appendf(b, "OVERLAY_NETWORK=%s\nOVERLAY_SUBNET=%s\n", e.Network, e.Subnet)
	}
	b = fmt.Appendf(b, "OVERLAY_MTU=%d\nOVERLAY_IPMASQ=%t\n", e.MTU, e.IPMasq)
	if e.IPv6Network.IsValid() {
		b = fmt.Appendf(b, "OVERLAY_IPV6_NETWORK=%s\nOVERLAY_IPV6_SUBNET=%s\n", e.IPv6Network, e.IPv6Subnet)
	}
	return b
}

// ParseEnv parses subnet.env. Blank lines and # comments are ignored, unknown
// keys are ignored (a newer daemon may add some), OVERLAY_MTU and
// OVERLAY_IPMASQ must be present, and so must one pair of network keys or
// both: OVERLAY_NETWORK and OVERLAY_SUBNET (absent only on an IPv6-only
// host), OVERLAY_IPV6_NETWORK and OVERLAY_IPV6_SUBNET; each pair comes
// together or not at all.
func ParseEnv(data []byte) (Env, error) {
	var e Env
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, val, ok := strings.Cut(text, "=")
		if !ok {
			return Env{}, fmt.Errorf("%w: line %d %q is not KEY=VALUE", ErrEnvInvalid, line, text)
		}
		var err error
		switch key {
		case "OVERLAY_NETWORK":
			e.Network, err = netip.ParsePrefix(val)
		case "OVERLAY_SUBNET":
			e.Subnet, err = netip.ParsePrefix(val)
		case "OVERLAY_MTU":
			e.MTU, err = strconv.Atoi(val)
		case "OVERLAY_IPMASQ":
			e.IPMasq, err = strconv.ParseBool(val)
		case "OVERLAY_IPV6_NETWORK":
			e.IPv6Network, err = netip.ParsePrefix(val)
		case "OVERLAY_IPV6_SUBNET":
			e.IPv6Subnet, err = netip.ParsePrefix(val)
		default:
			continue
		}
		if err != nil {
			return Env{}, fmt.Errorf("%w: %s=%q: %v", ErrEnvInvalid, key, val, err)
		}
		seen[key] = true
	}
	if err := sc.Err(); err != nil {
		return Env{}, fmt.Errorf("%w: %v", ErrEnvInvalid, err)
	}
	required := []string{"OVERLAY_MTU", "OVERLAY_IPMASQ"}
	if !seen["OVERLAY_IPV6_NETWORK"] && !seen["OVERLAY_IPV6_SUBNET"] {
		required = append([]string{"OVERLAY_NETWORK", "OVERLAY_SUBNET"}, required...)
	}
	for _, k := range required {
		if !seen[k] {
			return Env{}, fmt.Errorf("%w: %s is missing", ErrEnvInvalid, k)
		}
	}
	for _, pair := range [][2]string{{"OVERLAY_NETWORK", "OVERLAY_SUBNET"}, {"OVERLAY_IPV6_NETWORK", "OVERLAY_IPV6_SUBNET"}} {
		if seen[pair[0]] != seen[pair[1]] {
			return Env{}, fmt.Errorf("%w: %s and %s come together: one is missing", ErrEnvInvalid, pair[0], pair[1])
		}
	}
	if err := e.Validate(); err != nil {
		return Env{}, err
	}
	return e, nil
}

// ReadEnv reads and parses the file at path. A missing file wraps
// fs.ErrNotExist so callers can tell "daemon not ready yet" from corruption.
func ReadEnv(path string) (Env, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Env{}, fmt.Errorf("read subnet file %s: %w", path, err)
	}
	e, err := ParseEnv(data)
	if err != nil {
		return Env{}, fmt.Errorf("subnet file %s: %w", path, err)
	}
	return e, nil
}

// WriteEnv validates e and writes it to path atomically with mode 0644,
// creating the directory if needed.
func WriteEnv(path string, e Env) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	return atomicfile.Write(path, e.Marshal(), 0o644)
}
