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
	// Network is the whole cluster network (OVERLAY_NETWORK).
	Network netip.Prefix
	// Subnet is the first usable address of the lease with the lease's prefix
	// length (OVERLAY_SUBNET), e.g. 10.244.7.1/24 for the lease 10.244.7.0/24.
	Subnet netip.Prefix
	// MTU is the MTU pods should use (OVERLAY_MTU).
	MTU int
	// IPMasq tells whether overlayd masquerades traffic leaving the cluster
	// network itself (OVERLAY_IPMASQ), so the bridge plugin must not.
	IPMasq bool
}

// ErrEnvInvalid marks a subnet.env that exists but cannot be used.
var ErrEnvInvalid = errors.New("invalid subnet.env")

// NewEnv builds the Env for a lease: OVERLAY_SUBNET is the lease's first
// usable address.
func NewEnv(network, lease netip.Prefix, mtu int, ipMasq bool) Env {
	return Env{Network: network, Subnet: netip.PrefixFrom(lease.Masked().Addr().Next(), lease.Bits()), MTU: mtu, IPMasq: ipMasq}
}

// Lease returns the leased subnet (the network address form of Subnet).
func (e Env) Lease() netip.Prefix { return e.Subnet.Masked() }

// Validate reports whether the values are coherent: both prefixes IPv4, the
// subnet inside the network, an MTU a link can carry.
func (e Env) Validate() error {
	switch {
	case !e.Network.IsValid() || !e.Network.Addr().Is4():
		return fmt.Errorf("%w: OVERLAY_NETWORK %q is not an IPv4 prefix", ErrEnvInvalid, e.Network)
	case !e.Subnet.IsValid() || !e.Subnet.Addr().Is4():
		return fmt.Errorf("%w: OVERLAY_SUBNET %q is not an IPv4 prefix", ErrEnvInvalid, e.Subnet)
	case e.Subnet.Bits() < e.Network.Bits() || !e.Network.Contains(e.Subnet.Addr()):
		return fmt.Errorf("%w: OVERLAY_SUBNET %s is not inside OVERLAY_NETWORK %s", ErrEnvInvalid, e.Subnet, e.Network)
	case e.MTU < 576 || e.MTU > 65535:
		return fmt.Errorf("%w: OVERLAY_MTU %d is outside 576..65535", ErrEnvInvalid, e.MTU)
	}
	return nil
}

// Marshal renders the file in the contract's key order.
func (e Env) Marshal() []byte {
	return fmt.Appendf(nil, "OVERLAY_NETWORK=%s\nOVERLAY_SUBNET=%s\nOVERLAY_MTU=%d\nOVERLAY_IPMASQ=%t\n",
		e.Network, e.Subnet, e.MTU, e.IPMasq)
}

// ParseEnv parses subnet.env. Blank lines and # comments are ignored, unknown
// keys are ignored (a newer daemon may add some), and every one of the four
// contract keys must be present and valid.
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
	for _, k := range []string{"OVERLAY_NETWORK", "OVERLAY_SUBNET", "OVERLAY_MTU", "OVERLAY_IPMASQ"} {
		if !seen[k] {
			return Env{}, fmt.Errorf("%w: %s is missing", ErrEnvInvalid, k)
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
