package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Defaults of the network config, the same as flannel's for vxlan.
const (
	DefaultBackendType = "vxlan"
	DefaultVNI         = 1
	DefaultPort        = 8472
	// MaxConfigSize bounds the config read from etcd or a file; a real one is
	// a few hundred bytes.
	MaxConfigSize = 64 << 10
)

// ErrInvalidConfig marks every config validation failure.
var ErrInvalidConfig = errors.New("invalid network config")

// Config is the network config stored at <prefix>/config, after defaults.
// Its JSON form is flannel's, so one etcd prefix can serve both.
type Config struct {
	Network   netip.Prefix
	SubnetLen int
	SubnetMin netip.Addr
	SubnetMax netip.Addr
	Backend   BackendConfig
}

// BackendConfig is the "Backend" object. Only vxlan is supported.
type BackendConfig struct {
	Type string
	// VNI is the VXLAN network identifier (1..16777215).
	VNI int
	// Port is the VXLAN UDP destination port.
	Port int
	// DirectRouting routes to peers on the same L2 segment without
	// encapsulation.
	DirectRouting bool
	// MTU of the VXLAN device; 0 means the underlay MTU minus 50.
	MTU int
}

// rawConfig holds the JSON members as given. Pointers tell "absent" from
// zero where flannel treats them differently; unknown members are ignored,
// as flannel does.
type rawConfig struct {
	Network   string
	SubnetLen int
	SubnetMin string
	SubnetMax string
	Backend   *rawBackend
}

type rawBackend struct {
	Type          string
	VNI           *int
	Port          *int
	DirectRouting bool
	MTU           int
}

const (
	wantString = "a string"
	wantNumber = "a whole number"
	wantBool   = "true or false"
)

// ParseConfig decodes and validates a network config and applies flannel's
// defaults. Errors wrap ErrInvalidConfig and name the field as written in
// the JSON, with its value.
func ParseConfig(data []byte) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, fmt.Errorf("%w: %d bytes is larger than the %d-byte limit", ErrInvalidConfig, len(data), MaxConfigSize)
	}
	if err := oneValue(data); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var raw rawConfig
	if err := decodeObject("", data, []field{
		{"Network", &raw.Network, wantString + " such as \"10.244.0.0/16\"", nil},
		{"SubnetLen", &raw.SubnetLen, wantNumber + " such as 24", nil},
		{"SubnetMin", &raw.SubnetMin, wantString + " such as \"10.244.1.0\"", nil},
		{"SubnetMax", &raw.SubnetMax, wantString + " such as \"10.244.255.0\"", nil},
		{name: "Backend", sub: func(path string, data json.RawMessage) error {
			b := &rawBackend{}
			raw.Backend = b
			return decodeObject(path, data, []field{
				{"Type", &b.Type, wantString + " such as \"vxlan\"", nil},
				{"VNI", &b.VNI, wantNumber + " in 1..16777215", nil},
				{"Port", &b.Port, wantNumber + " in 1..65535", nil},
				{"DirectRouting", &b.DirectRouting, wantBool, nil},
				{"MTU", &b.MTU, wantNumber + " (0, or 576..65485)", nil},
			})
		}},
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return raw.resolve()
}

// oneValue checks data is one JSON value with nothing after it.
func oneValue(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return syntaxError("", data, err)
	}
	if dec.More() {
		line, col := position(data, dec.InputOffset()+1)
		return fmt.Errorf("unexpected data after the JSON object at line %d, column %d", line, col)
	}
	return nil
}

func (raw rawConfig) resolve() (*Config, error) {
	if raw.Network == "" {
		return nil, fmt.Errorf("%w: Network is missing (e.g. \"Network\": \"10.244.0.0/16\")", ErrInvalidConfig)
	}
	network, err := netip.ParsePrefix(raw.Network)
	if err != nil || !network.Addr().Is4() {
		return nil, fmt.Errorf("%w: Network %q is not an IPv4 prefix such as 10.244.0.0/16", ErrInvalidConfig, raw.Network)
	}
	if network != network.Masked() {
		return nil, fmt.Errorf("%w: Network %q has host bits set; did you mean %s?", ErrInvalidConfig, raw.Network, network.Masked())
	}
	cfg := &Config{Network: network, SubnetLen: raw.SubnetLen}
	if err := cfg.resolveSubnetLen(); err != nil {
		return nil, err
	}
	if cfg.SubnetMin, err = cfg.boundary("SubnetMin", raw.SubnetMin, cfg.firstUsable()); err != nil {
		return nil, err
	}
	if cfg.SubnetMax, err = cfg.boundary("SubnetMax", raw.SubnetMax, cfg.last()); err != nil {
		return nil, err
	}
	if cfg.SubnetMin.Compare(cfg.SubnetMax) > 0 {
		return nil, fmt.Errorf("%w: SubnetMin %s is above SubnetMax %s", ErrInvalidConfig, cfg.SubnetMin, cfg.SubnetMax)
	}
	if cfg.Backend, err = raw.Backend.resolve(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// resolveSubnetLen applies flannel's rule: a /24 per host when the network
// is a /22 or larger, else a quarter of the network; at least four subnets.
func (c *Config) resolveSubnetLen() error {
	bits := c.Network.Bits()
	if c.SubnetLen == 0 {
		switch {
		case bits > 28:
			return fmt.Errorf("%w: Network %s is too small: use a /28 or larger", ErrInvalidConfig, c.Network)
		case bits <= 22:
			c.SubnetLen = 24
		default:
			c.SubnetLen = bits + 2
		}
		return nil
	}
	if c.SubnetLen < 0 || c.SubnetLen > 30 {
		return fmt.Errorf("%w: SubnetLen %d is outside 1..30 (a host needs at least a /30)", ErrInvalidConfig, c.SubnetLen)
	}
	if c.SubnetLen < bits+2 {
		return fmt.Errorf("%w: SubnetLen %d leaves fewer than four subnets in Network %s: use %d or more", ErrInvalidConfig, c.SubnetLen, c.Network, bits+2)
	}
	return nil
}

// boundary parses SubnetMin or SubnetMax, or returns def when absent.
func (c *Config) boundary(field, value string, def netip.Addr) (netip.Addr, error) {
	if value == "" {
		return def, nil
	}
	addr, err := netip.ParseAddr(value)
	if err != nil || !addr.Is4() {
		return netip.Addr{}, fmt.Errorf("%w: %s %q is not an IPv4 address", ErrInvalidConfig, field, value)
	}
	if !c.Network.Contains(addr) {
		return netip.Addr{}, fmt.Errorf("%w: %s %s is outside Network %s", ErrInvalidConfig, field, addr, c.Network)
	}
	if aligned := netip.PrefixFrom(addr, c.SubnetLen).Masked().Addr(); aligned != addr {
		return netip.Addr{}, fmt.Errorf("%w: %s %s is not on a /%d boundary (nearest below: %s)", ErrInvalidConfig, field, addr, c.SubnetLen, aligned)
	}
	return addr, nil
}

func (b *rawBackend) resolve() (BackendConfig, error) {
	out := BackendConfig{Type: DefaultBackendType, VNI: DefaultVNI, Port: DefaultPort}
	if b == nil {
		return out, nil
	}
	if b.Type != "" {
		out.Type = strings.ToLower(b.Type)
	}
	if out.Type != DefaultBackendType {
		return out, fmt.Errorf("%w: Backend.Type %q is not supported: overlay implements only \"vxlan\"", ErrInvalidConfig, b.Type)
	}
	if b.VNI != nil {
		out.VNI = *b.VNI
	}
	if out.VNI < 1 || out.VNI > 1<<24-1 {
		return out, fmt.Errorf("%w: Backend.VNI %d is outside 1..16777215", ErrInvalidConfig, out.VNI)
	}
	if b.Port != nil && *b.Port != 0 { // flannel treats 0 as "default"
		out.Port = *b.Port
	}
	if out.Port < 1 || out.Port > 65535 {
		return out, fmt.Errorf("%w: Backend.Port %d is outside 1..65535", ErrInvalidConfig, out.Port)
	}
	if b.MTU != 0 && (b.MTU < 576 || b.MTU > 65485) {
		return out, fmt.Errorf("%w: Backend.MTU %d is outside 576..65485 (0 means underlay MTU - 50)", ErrInvalidConfig, b.MTU)
	}
	out.MTU = b.MTU
	out.DirectRouting = b.DirectRouting
	return out, nil
}

// subnetSize is the number of addresses in one subnet.
func (c *Config) subnetSize() uint32 { return 1 << (32 - c.SubnetLen) }

// firstUsable is the second subnet of the network: the first is skipped, as
// flannel does, so no lease's network address equals the cluster network's.
func (c *Config) firstUsable() netip.Addr {
	return addrFromUint(addrToUint(c.Network.Addr()) + c.subnetSize())
}

// last is the network address of the last subnet in the network.
func (c *Config) last() netip.Addr {
	hostBits := 32 - c.Network.Bits()
	end := addrToUint(c.Network.Addr()) | uint32(uint64(1)<<hostBits-1)
	return addrFromUint(end - c.subnetSize() + 1)
}

// Contains reports whether p is a subnet this network can lease: inside
// Network, with exactly SubnetLen bits, on its boundary.
func (c *Config) Contains(p netip.Prefix) bool {
	return p.IsValid() && p.Bits() == c.SubnetLen && p.Masked() == p && c.Network.Contains(p.Addr())
}

// InRange reports whether p is a subnet the allocator may hand out: between
// SubnetMin and SubnetMax.
func (c *Config) InRange(p netip.Prefix) bool {
	return c.Contains(p) && p.Addr().Compare(c.SubnetMin) >= 0 && p.Addr().Compare(c.SubnetMax) <= 0
}

func addrToUint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrFromUint(u uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
}

// MarshalJSON renders the effective config (defaults filled in) in flannel's
// format, so it can be stored back as it is.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Network   string
		SubnetLen int
		SubnetMin string
		SubnetMax string
		Backend   BackendConfig
	}{c.Network.String(), c.SubnetLen, c.SubnetMin.String(), c.SubnetMax.String(), c.Backend})
}
