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
	// EnableIPv4 (flannel's default: true) and EnableIPv6 say which
	// families the overlay carries; at least one.
	EnableIPv4 bool
	EnableIPv6 bool
	// Pool is the IPv4 pool (Network, SubnetLen, SubnetMin, SubnetMax),
	// zero unless EnableIPv4.
	Pool
	// IPv6 is the IPv6 pool (IPv6Network, IPv6SubnetLen, IPv6SubnetMin,
	// IPv6SubnetMax), zero unless EnableIPv6.
	IPv6    Pool
	Backend BackendConfig
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
	EnableIPv4    *bool
	EnableIPv6    bool
	Network       string
	SubnetLen     int
	SubnetMin     string
	SubnetMax     string
	IPv6Network   string
	IPv6SubnetLen int
	IPv6SubnetMin string
	IPv6SubnetMax string
	Backend       *rawBackend
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
		{"EnableIPv4", &raw.EnableIPv4, wantBool, nil},
		{"EnableIPv6", &raw.EnableIPv6, wantBool, nil},
		{"Network", &raw.Network, wantString + " such as \"10.244.0.0/16\"", nil},
		{"SubnetLen", &raw.SubnetLen, wantNumber + " such as 24", nil},
		{"SubnetMin", &raw.SubnetMin, wantString + " such as \"10.244.1.0\"", nil},
		{"SubnetMax", &raw.SubnetMax, wantString + " such as \"10.244.255.0\"", nil},
		{"IPv6Network", &raw.IPv6Network, wantString + " such as \"fd00:10:244::/48\"", nil},
		{"IPv6SubnetLen", &raw.IPv6SubnetLen, wantNumber + " such as 64", nil},
		{"IPv6SubnetMin", &raw.IPv6SubnetMin, wantString + " such as \"fd00:10:244:1::\"", nil},
		{"IPv6SubnetMax", &raw.IPv6SubnetMax, wantString + " such as \"fd00:10:244:ffff::\"", nil},
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
	cfg := &Config{EnableIPv4: raw.EnableIPv4 == nil || *raw.EnableIPv4, EnableIPv6: raw.EnableIPv6}
	if !cfg.EnableIPv4 && !cfg.EnableIPv6 {
		return nil, fmt.Errorf("%w: EnableIPv4 and EnableIPv6 are both false: enable at least one family", ErrInvalidConfig)
	}
	var err error
	if cfg.EnableIPv4 {
		if cfg.Pool, err = ipv4.resolve(raw.Network, raw.SubnetLen, raw.SubnetMin, raw.SubnetMax); err != nil {
			return nil, err
		}
	}
	if cfg.EnableIPv6 {
		if cfg.IPv6, err = ipv6.resolve(raw.IPv6Network, raw.IPv6SubnetLen, raw.IPv6SubnetMin, raw.IPv6SubnetMax); err != nil {
			return nil, err
		}
	}
	if cfg.Backend, err = raw.Backend.resolve(); err != nil {
		return nil, err
	}
	return cfg, nil
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

// NetworkHolding names the network of c that holds ip, as the config
// writes it ("Network 10.244.0.0/16", "IPv6Network fd00:10:244::/48"),
// or returns "" if none does. A host's underlay address must lie outside
// the network of its family: every host skips a lease whose public
// address is inside (VXLAN to it would be routed into the overlay).
func (c *Config) NetworkHolding(ip netip.Addr) string {
	switch {
	case c.EnableIPv4 && c.Network.Contains(ip):
		return ipv4.network + " " + c.Network.String()
	case c.EnableIPv6 && c.IPv6.Network.Contains(ip):
		return ipv6.network + " " + c.IPv6.Network.String()
	}
	return ""
}

// MarshalJSON renders the effective config (defaults filled in) in flannel's
// format, so it can be stored back as it is. A family that is off is left
// out (EnableIPv4 is written only when false).
func (c Config) MarshalJSON() ([]byte, error) {
	type v4 struct {
		Network   string
		SubnetLen int
		SubnetMin string
		SubnetMax string
	}
	type v6 struct {
		EnableIPv6    bool
		IPv6Network   string
		IPv6SubnetLen int
		IPv6SubnetMin string
		IPv6SubnetMax string
	}
	var out struct {
		EnableIPv4 *bool `json:",omitempty"`
		*v4
		*v6
		Backend BackendConfig
	}
	if c.EnableIPv4 {
		out.v4 = &v4{c.Network.String(), c.SubnetLen, c.SubnetMin.String(), c.SubnetMax.String()}
	} else {
		out.EnableIPv4 = new(bool)
	}
	if c.EnableIPv6 {
		out.v6 = &v6{true, c.IPv6.Network.String(), c.IPv6.SubnetLen, c.IPv6.SubnetMin.String(), c.IPv6.SubnetMax.String()}
	}
	out.Backend = c.Backend
	return json.Marshal(out)
}
