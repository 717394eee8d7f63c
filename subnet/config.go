package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/overlaynet/overlay/internal/lib/jsonobj"
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
	// Extra holds, in the order written, the members overlay does not act
	// on (flanneld's EnableNFTables, any unknown one) and those of a family
	// the network does not carry: they are written back as given, so
	// `config get -w json` | `config put` loses nothing flanneld reads.
	Extra []Member
}

// Member is one JSON member kept as written (Value compacted).
type Member struct {
	Name  string
	Value json.RawMessage
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
	// Extra holds the other members of "Backend" as written (flanneld's
	// GBP, MacPrefix, Learning, any unknown one), written back as given.
	Extra []Member
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
	wantString = jsonobj.WantString
	wantNumber = jsonobj.WantNumber
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
	if err := twinsError(data); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var raw rawConfig
	if err := jsonobj.Decode("", data, []jsonobj.Field{
		{Name: "EnableIPv4", Dst: &raw.EnableIPv4, Want: wantBool},
		{Name: "EnableIPv6", Dst: &raw.EnableIPv6, Want: wantBool},
		{Name: "Network", Dst: &raw.Network, Want: wantString + " such as \"10.244.0.0/16\""},
		{Name: "SubnetLen", Dst: &raw.SubnetLen, Want: wantNumber + " such as 24"},
		{Name: "SubnetMin", Dst: &raw.SubnetMin, Want: wantString + " such as \"10.244.1.0\""},
		{Name: "SubnetMax", Dst: &raw.SubnetMax, Want: wantString + " such as \"10.244.255.0\""},
		{Name: "IPv6Network", Dst: &raw.IPv6Network, Want: wantString + " such as \"fd00:10:244::/48\""},
		{Name: "IPv6SubnetLen", Dst: &raw.IPv6SubnetLen, Want: wantNumber + " such as 64"},
		{Name: "IPv6SubnetMin", Dst: &raw.IPv6SubnetMin, Want: wantString + " such as \"fd00:10:244:1::\""},
		{Name: "IPv6SubnetMax", Dst: &raw.IPv6SubnetMax, Want: wantString + " such as \"fd00:10:244:ffff::\""},
		{Name: "Backend", Sub: func(path string, data json.RawMessage) error {
			b := &rawBackend{}
			raw.Backend = b
			return jsonobj.Decode(path, data, []jsonobj.Field{
				{Name: "Type", Dst: &b.Type, Want: wantString + " such as \"vxlan\""},
				{Name: "VNI", Dst: &b.VNI, Want: wantNumber + " in 1..16777215"},
				{Name: "Port", Dst: &b.Port, Want: wantNumber + " in 1..65535"},
				{Name: "DirectRouting", Dst: &b.DirectRouting, Want: wantBool},
				{Name: "MTU", Dst: &b.MTU, Want: wantNumber + " (0, or 576..65485)"},
			})
		}},
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg, err := raw.resolve()
	if err != nil {
		return nil, err
	}
	if err := cfg.keepExtra(data); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return cfg, nil
}

// keepExtra sets c.Extra and c.Backend.Extra from the config document
// data: every member MarshalJSON does not write.
func (c *Config) keepExtra(data []byte) error {
	written := []string{"EnableIPv4", "EnableIPv6", "Backend"} // the flags are written when not their default
	if c.EnableIPv4 {
		written = append(written, "Network", "SubnetLen", "SubnetMin", "SubnetMax")
	}
	if c.EnableIPv6 {
		written = append(written, "IPv6Network", "IPv6SubnetLen", "IPv6SubnetMin", "IPv6SubnetMax")
	}
	all, err := membersOf(data)
	if err != nil {
		return err
	}
	c.Extra = extraMembers(all, written)
	for _, m := range all {
		if strings.EqualFold(m.Name, "Backend") && !bytes.Equal(m.Value, []byte("null")) {
			backend, err := membersOf(m.Value)
			if err != nil {
				return err
			}
			c.Backend.Extra = extraMembers(backend, []string{"Type", "VNI", "Port", "DirectRouting", "MTU"})
		}
	}
	return nil
}

// membersOf lists the members of the JSON object data in order, values
// compacted.
func membersOf(data []byte) ([]Member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // '{', checked by decodeObject
		return nil, err
	}
	var out []Member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, err
		}
		out = append(out, Member{Name: tok.(string), Value: buf.Bytes()})
	}
	return out, nil
}

// extraMembers are the members of all not named (in any case) in known;
// nil if none.
func extraMembers(all []Member, known []string) []Member {
	var out []Member
	for _, m := range all {
		if !slices.ContainsFunc(known, func(k string) bool { return strings.EqualFold(k, m.Name) }) {
			out = append(out, m)
		}
	}
	return out
}

// appendMembers adds extra to the JSON object obj, after its members.
func appendMembers(obj []byte, extra []Member) ([]byte, error) {
	if len(extra) == 0 {
		return obj, nil
	}
	out := bytes.TrimSuffix(bytes.TrimSpace(obj), []byte("}"))
	for _, m := range extra {
		name, err := json.Marshal(m.Name)
		if err != nil {
			return nil, err
		}
		if !bytes.HasSuffix(out, []byte("{")) {
			out = append(out, ',')
		}
		out = append(append(append(out, name...), ':'), m.Value...)
	}
	return append(out, '}'), nil
}

// oneValue checks data is one JSON value with nothing after it.
func oneValue(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return jsonobj.SyntaxError("", data, err)
	}
	if dec.More() {
		line, col := jsonobj.Position(data, dec.InputOffset()+1)
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

// ParseStorableConfig is ParseConfig followed by CheckStorable: a config
// as `overlayd config put` accepts one, and as kube mode accepts its file.
func ParseStorableConfig(data []byte) (*Config, error) {
	cfg, err := ParseConfig(data)
	if err == nil {
		err = cfg.CheckStorable()
	}
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// ReadNetConf reads kube mode's network config file (--net-config-path,
// the ConfigMap's net-conf.json) and checks it as `overlayd config put`
// checks one. It returns the bytes read even when they are refused.
func ReadNetConf(path string) ([]byte, *Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--net-config-path: %w (the network config file of kube mode: mount the ConfigMap's net-conf.json there)", err)
	}
	cfg, err := ParseStorableConfig(data)
	if err != nil {
		return data, nil, fmt.Errorf("--net-config-path %s: %w", path, err)
	}
	return data, cfg, nil
}

// CheckStorable applies what a config must meet to be stored, beyond what
// every reader of a stored one applies (ParseConfig): no network in the
// class E range, which a cluster may already use (see specialRange).
// `config put` and `config validate` call it.
func (c *Config) CheckStorable() error {
	if c.EnableIPv4 {
		if err := ipv4.checkRange(c.Network, true); err != nil {
			return err
		}
	}
	if c.EnableIPv6 {
		return ipv6.checkRange(c.IPv6.Network, true)
	}
	return nil
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
// out (EnableIPv4 is written only when false) but for members of it the
// stored config had, kept with the others in Extra, after the rest.
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
	// Without HTML escaping: Marshal would rewrite a kept member of
	// Backend ("&" as "\u0026"), and it is to be written back as given.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return appendMembers(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), c.Extra)
}

// MarshalJSON renders the "Backend" object: the fields overlay reads, then
// Extra as given.
func (b BackendConfig) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(struct {
		Type          string
		VNI           int
		Port          int
		DirectRouting bool
		MTU           int
	}{b.Type, b.VNI, b.Port, b.DirectRouting, b.MTU})
	if err != nil {
		return nil, err
	}
	return appendMembers(data, b.Extra)
}
