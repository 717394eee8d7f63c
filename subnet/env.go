package subnet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/internal/lib/atomicfile"
)

// DefaultEnvFile is where overlayd writes subnet.env and overlay-cni reads it.
const DefaultEnvFile = "/run/overlay/subnet.env"

// DefaultHealthAddr is where overlayd serves /healthz, /readyz, /metrics
// and /status unless --health-addr says otherwise (loopback only, like
// most node agents), and so where overlay-cni's STATUS asks it: like
// subnet.env, a meeting point of the daemon and the plugin, kept here, in
// the one package both import.
const DefaultHealthAddr = "127.0.0.1:9436"

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

// EnvFormat is the dialect of subnet.env: overlayd's own keys (OVERLAY_*,
// DESIGN.md §6) or flanneld's (FLANNEL_*), for hosts where flannel's CNI
// plugin or other tools written for flannel still read the file.
type EnvFormat string

const (
	// FormatOverlay is the contract's format, the default.
	FormatOverlay EnvFormat = "overlay"
	// FormatFlannel is what flanneld writes to /run/flannel/subnet.env.
	FormatFlannel EnvFormat = "flannel"
)

// ParseEnvFormat reads a format's name; "" is FormatOverlay.
func ParseEnvFormat(s string) (EnvFormat, error) {
	switch f := EnvFormat(s); f {
	case "":
		return FormatOverlay, nil
	case FormatOverlay, FormatFlannel:
		return f, nil
	}
	return "", fmt.Errorf("unknown subnet.env format %q: want %s or %s", s, FormatOverlay, FormatFlannel)
}

// prefix starts every key of the format.
func (f EnvFormat) prefix() string {
	if f == FormatFlannel {
		return "FLANNEL_"
	}
	return "OVERLAY_"
}

// envKeys are the keys both formats have, without their prefix.
var envKeys = []string{"NETWORK", "SUBNET", "MTU", "IPMASQ", "IPV6_NETWORK", "IPV6_SUBNET"}

// Validate reports whether the values are coherent: the IPv4 prefixes (but
// for an IPv6-only host) and the IPv6 ones, if given, of their family, each
// subnet inside its network, an MTU a link can carry. Errors name the
// contract's keys.
func (e Env) Validate() error { return e.validate(FormatOverlay.prefix()) }

// validate is Validate with errors naming the keys of the format whose
// keys start with p.
func (e Env) validate(p string) error {
	v6 := e.IPv6Network.IsValid() || e.IPv6Subnet.IsValid()
	if e.Network.IsValid() || e.Subnet.IsValid() || !v6 {
		if err := checkEnvPair(ipv4, p+"NETWORK", e.Network, p+"SUBNET", e.Subnet); err != nil {
			return err
		}
	}
	if v6 {
		if err := checkEnvPair(ipv6, p+"IPV6_NETWORK", e.IPv6Network, p+"IPV6_SUBNET", e.IPv6Subnet); err != nil {
			return err
		}
	}
	if e.MTU < 576 || e.MTU > 65535 {
		return fmt.Errorf("%w: %sMTU %d is outside 576..65535", ErrEnvInvalid, p, e.MTU)
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
	v4, v6, rest := e.marshalParts(FormatOverlay.prefix())
	return slices.Concat(v4, rest, v6)
}

// MarshalFlannel renders the file exactly as flanneld (v0.28,
// pkg/subnet WriteSubnetFile) does: FLANNEL_NETWORK and FLANNEL_SUBNET
// (absent on an IPv6-only host), then FLANNEL_IPV6_NETWORK and
// FLANNEL_IPV6_SUBNET (if the network carries IPv6), then FLANNEL_MTU and
// FLANNEL_IPMASQ; the values are formatted as in the contract.
func (e Env) MarshalFlannel() []byte {
	v4, v6, rest := e.marshalParts(FormatFlannel.prefix())
	return slices.Concat(v4, v6, rest)
}

// MarshalFormat renders the file in format f.
func (e Env) MarshalFormat(f EnvFormat) ([]byte, error) {
	f, err := ParseEnvFormat(string(f))
	if err != nil {
		return nil, err
	}
	if f == FormatFlannel {
		return e.MarshalFlannel(), nil
	}
	return e.Marshal(), nil
}

// marshalParts renders the IPv4 pair, the IPv6 pair and MTU with IPMASQ,
// keys starting with p; both formats put the same lines in another order.
func (e Env) marshalParts(p string) (v4, v6, rest []byte) {
	if e.Network.IsValid() {
		v4 = fmt.Appendf(v4, "%sNETWORK=%s\n%sSUBNET=%s\n", p, e.Network, p, e.Subnet)
	}
	if e.IPv6Network.IsValid() {
		v6 = fmt.Appendf(v6, "%sIPV6_NETWORK=%s\n%sIPV6_SUBNET=%s\n", p, e.IPv6Network, p, e.IPv6Subnet)
	}
	rest = fmt.Appendf(rest, "%sMTU=%d\n%sIPMASQ=%t\n", p, e.MTU, p, e.IPMasq)
	return v4, v6, rest
}

// ParseEnv parses subnet.env in either format: overlayd's (OVERLAY_*) or,
// when the file has none of those keys, flanneld's (FLANNEL_*), so that
// overlay-cni can read /run/flannel/subnet.env. A file with known keys of
// both formats is refused, naming them: which one would be meant is a
// guess. Blank lines and # comments are ignored, unknown keys are ignored
// (a newer daemon may add some), MTU and IPMASQ must be present, and so
// must one pair of network keys or both: NETWORK and SUBNET (absent only on
// an IPv6-only host), IPV6_NETWORK and IPV6_SUBNET; each pair comes
// together or not at all.
func ParseEnv(data []byte) (Env, error) {
	vals, err := scanEnv(data)
	if err != nil {
		return Env{}, err
	}
	f, err := envFormatOf(vals)
	if err != nil {
		return Env{}, err
	}
	p := f.prefix()
	var e Env
	for _, k := range envKeys {
		val, ok := vals[p+k]
		if !ok {
			continue
		}
		if err := e.set(k, val); err != nil {
			return Env{}, fmt.Errorf("%w: %s=%q: %v", ErrEnvInvalid, p+k, val, err)
		}
	}
	if err := checkEnvKeys(vals, p); err != nil {
		return Env{}, err
	}
	if err := e.validate(p); err != nil {
		return Env{}, err
	}
	return e, nil
}

// scanEnv returns the known keys of either format with their values (the
// last one when a key repeats).
func scanEnv(data []byte) (map[string]string, error) {
	known := map[string]bool{}
	for _, k := range envKeys {
		known[FormatOverlay.prefix()+k], known[FormatFlannel.prefix()+k] = true, true
	}
	vals := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, val, ok := strings.Cut(text, "=")
		if !ok {
			return nil, fmt.Errorf("%w: line %d %q is not KEY=VALUE", ErrEnvInvalid, line, text)
		}
		if known[key] {
			vals[key] = val
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrEnvInvalid, err)
	}
	return vals, nil
}

// envFormatOf tells the format from the keys present: flannel's only when
// no key of the contract's is there.
func envFormatOf(vals map[string]string) (EnvFormat, error) {
	var keys [2][]string
	for i, f := range []EnvFormat{FormatOverlay, FormatFlannel} {
		for _, k := range envKeys {
			if _, ok := vals[f.prefix()+k]; ok {
				keys[i] = append(keys[i], f.prefix()+k)
			}
		}
	}
	switch {
	case len(keys[0]) > 0 && len(keys[1]) > 0:
		return "", fmt.Errorf("%w: it has keys of both formats, overlayd's (%s) and flanneld's (%s): write one format only",
			ErrEnvInvalid, strings.Join(keys[0], ", "), strings.Join(keys[1], ", "))
	case len(keys[1]) > 0:
		return FormatFlannel, nil
	}
	return FormatOverlay, nil
}

// set parses the value of key k (without its prefix) into e.
func (e *Env) set(k, val string) error {
	var err error
	switch k {
	case "MTU":
		e.MTU, err = strconv.Atoi(val)
	case "IPMASQ":
		e.IPMasq, err = strconv.ParseBool(val)
	case "NETWORK", "IPV6_NETWORK":
		if strings.Contains(val, ",") {
			// flannel's CNI plugin accepts a list here (flanneld's
			// multi-ClusterCIDR mode wrote one); an overlay network has
			// one prefix per family.
			return errors.New("lists several networks; only one is supported")
		}
		fallthrough
	default:
		prefixes := map[string]*netip.Prefix{
			"NETWORK": &e.Network, "SUBNET": &e.Subnet, "IPV6_NETWORK": &e.IPv6Network, "IPV6_SUBNET": &e.IPv6Subnet,
		}
		*prefixes[k], err = netip.ParsePrefix(val)
	}
	return err
}

// checkEnvKeys checks that the keys required of a file with prefix p are
// there, and that each network comes with its subnet.
func checkEnvKeys(vals map[string]string, p string) error {
	has := func(k string) bool { _, ok := vals[p+k]; return ok }
	required := []string{"MTU", "IPMASQ"}
	if !has("IPV6_NETWORK") && !has("IPV6_SUBNET") {
		required = append([]string{"NETWORK", "SUBNET"}, required...)
	}
	for _, k := range required {
		if !has(k) {
			return fmt.Errorf("%w: %s is missing", ErrEnvInvalid, p+k)
		}
	}
	for _, pair := range [][2]string{{"NETWORK", "SUBNET"}, {"IPV6_NETWORK", "IPV6_SUBNET"}} {
		if has(pair[0]) != has(pair[1]) {
			return fmt.Errorf("%w: %s and %s come together: one is missing", ErrEnvInvalid, p+pair[0], p+pair[1])
		}
	}
	return nil
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

// WriteEnv validates e and writes it to path in the contract's format,
// atomically with mode 0644, creating the directory if needed.
func WriteEnv(path string, e Env) error { return WriteEnvFormat(path, e, FormatOverlay) }

// WriteEnvFormat is WriteEnv in format f.
func WriteEnvFormat(path string, e Env, f EnvFormat) error {
	f, err := ParseEnvFormat(string(f))
	if err != nil {
		return err
	}
	if err := e.validate(f.prefix()); err != nil {
		return err
	}
	data, err := e.MarshalFormat(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	return atomicfile.Write(path, data, 0o644)
}
