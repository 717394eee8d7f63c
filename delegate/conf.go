package delegate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/overlaynet/overlay/subnet"
)

// Defaults of overlay-cni's configuration (DESIGN.md §7).
const (
	// DefaultSubnetFile is where overlayd writes subnet.env.
	DefaultSubnetFile = subnet.DefaultEnvFile
	// DefaultDataDir holds the cached delegate configurations.
	DefaultDataDir = "/var/lib/cni/overlay"
	// DefaultDelegateType is the plugin overlay-cni delegates to.
	DefaultDelegateType = "bridge"
	// DefaultBridge is the host bridge the pods' veths are enslaved to, as
	// flannel's (and the bridge plugin's own default).
	DefaultBridge = "cni0"
	// HostLocalDefaultDataDir is where host-local keeps its reservations
	// when the ipam section sets no dataDir.
	HostLocalDefaultDataDir = "/var/lib/cni/networks"
)

// ErrInvalidConfig marks a network configuration overlay-cni cannot use.
var ErrInvalidConfig = errors.New("invalid overlay-cni network configuration")

// NetConf is overlay-cni's network configuration as a runtime hands it to the
// plugin on stdin (one plugin of a conflist, with name and cniVersion
// injected by the runtime).
type NetConf struct {
	// CNIVersion and Name come from the runtime; the delegate gets both.
	CNIVersion string
	Name       string

	// SubnetFile is subnet.env ("subnetFile", default DefaultSubnetFile).
	SubnetFile string
	// DataDir holds the cache ("dataDir", default DefaultDataDir).
	DataDir string
	// FlannelDataDir is flannel's CNI plugin's cache ("flannelDataDir",
	// flannel's default is /var/lib/cni/flannel): DEL, CHECK and GC of
	// pods that flannel's plugin added before the conflist switched to
	// overlay-cni use it. Empty (the default): not looked at, since GC
	// removes files in it and it is another program's directory.
	FlannelDataDir string
	// HealthAddr is overlayd's health endpoint, a loopback address
	// ("healthAddr", default DefaultHealthAddr); STATUS asks its /readyz.
	// Empty: STATUS does not ask overlayd.
	HealthAddr string

	// DelegateType is the delegate plugin ("delegate.type", default bridge).
	DelegateType string
	// Delegate holds the user's "delegate" keys other than name, cniVersion,
	// ipam, prevResult and cni.dev/* (those are always ours), raw.
	Delegate map[string]json.RawMessage
	// IPAM is the user's ipam base ("ipam", or "delegate.ipam"), raw; nil
	// when none is given. Its type and ranges are always replaced.
	IPAM map[string]json.RawMessage

	// RuntimeConfig, Args and PrevResult are forwarded as given (nil when
	// absent or null).
	RuntimeConfig json.RawMessage
	Args          json.RawMessage
	PrevResult    json.RawMessage

	// ValidAttachments is the union of "cni.dev/valid-attachments" and
	// "cni.dev/attachments" (GC only). HasValidAttachments tells whether
	// either key was present at all, to tell "none valid" from "not said".
	ValidAttachments    []types.GCAttachment
	HasValidAttachments bool
}

// rawConf is the wire form, decoded before validation.
type rawConf struct {
	CNIVersion       string          `json:"cniVersion"`
	Name             string          `json:"name"`
	SubnetFile       *string         `json:"subnetFile"`
	DataDir          *string         `json:"dataDir"`
	FlannelDataDir   *string         `json:"flannelDataDir"`
	HealthAddr       *string         `json:"healthAddr"`
	Delegate         json.RawMessage `json:"delegate"`
	IPAM             json.RawMessage `json:"ipam"`
	RuntimeConfig    json.RawMessage `json:"runtimeConfig"`
	Args             json.RawMessage `json:"args"`
	PrevResult       json.RawMessage `json:"prevResult"`
	ValidAttachments json.RawMessage `json:"cni.dev/valid-attachments"`
	Attachments      json.RawMessage `json:"cni.dev/attachments"`
}

// ParseConf parses and validates overlay-cni's configuration and fills in
// the defaults. Errors wrap ErrInvalidConfig and name the offending field.
func ParseConf(data []byte) (*NetConf, error) {
	var raw rawConf
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, invalidf("cannot decode the network configuration: %v", err)
	}
	if raw.CNIVersion == "" {
		return nil, invalidf("cniVersion is missing")
	}
	if raw.Name == "" {
		return nil, invalidf("name is missing")
	}
	if err := utils.ValidateNetworkName(raw.Name); err != nil {
		return nil, invalidf("name %q: %s", raw.Name, err.Msg)
	}
	if strings.Contains(raw.Name, "..") || len(raw.Name) > 128 {
		return nil, invalidf("name %q must not contain \"..\" nor be longer than 128 bytes (it names cache files)", raw.Name)
	}
	c := &NetConf{
		CNIVersion:   raw.CNIVersion,
		Name:         raw.Name,
		SubnetFile:   DefaultSubnetFile,
		DataDir:      DefaultDataDir,
		HealthAddr:   DefaultHealthAddr,
		DelegateType: DefaultDelegateType,
	}
	if err := c.setPaths(raw); err != nil {
		return nil, err
	}
	if err := c.setObjects(raw); err != nil {
		return nil, err
	}
	if err := c.setAttachments(raw); err != nil {
		return nil, err
	}
	return c, nil
}

// setPaths sets the files and directories (subnetFile, dataDir,
// flannelDataDir) and healthAddr from raw, each checked.
func (c *NetConf) setPaths(raw rawConf) error {
	var err error
	if raw.SubnetFile != nil {
		if c.SubnetFile, err = absPath("subnetFile", *raw.SubnetFile); err != nil {
			return err
		}
	}
	if raw.DataDir != nil {
		if c.DataDir, err = absPath("dataDir", *raw.DataDir); err != nil {
			return err
		}
	}
	if err := c.setFlannelDataDir(raw.FlannelDataDir); err != nil {
		return err
	}
	if raw.HealthAddr != nil {
		if err := checkHealthAddr(*raw.HealthAddr); err != nil {
			return err
		}
		c.HealthAddr = *raw.HealthAddr
	}
	return nil
}

// setObjects sets the objects passed through (delegate, ipam,
// runtimeConfig, args, prevResult) from raw, each checked to be one.
func (c *NetConf) setObjects(raw rawConf) error {
	var err error
	if c.Delegate, err = object("delegate", raw.Delegate); err != nil {
		return err
	}
	if c.IPAM, err = object("ipam", raw.IPAM); err != nil {
		return err
	}
	if err := c.takeDelegateKeys(); err != nil {
		return err
	}
	if err := validateIPAM(c.IPAM); err != nil {
		return err
	}
	if c.RuntimeConfig, err = objectRaw("runtimeConfig", raw.RuntimeConfig); err != nil {
		return err
	}
	if c.Args, err = objectRaw("args", raw.Args); err != nil {
		return err
	}
	c.PrevResult, err = objectRaw("prevResult", raw.PrevResult)
	return err
}

// setAttachments sets GC's valid attachments from either key.
func (c *NetConf) setAttachments(raw rawConf) error {
	for _, key := range []struct {
		name string
		raw  json.RawMessage
	}{{"cni.dev/valid-attachments", raw.ValidAttachments}, {"cni.dev/attachments", raw.Attachments}} {
		// Present but null is an empty list: libcni marshals a runtime's
		// nil slice that way (CRI-O's GC of a network without pods).
		if len(bytes.TrimSpace(key.raw)) == 0 {
			continue
		}
		var list []types.GCAttachment
		if err := json.Unmarshal(key.raw, &list); err != nil {
			return invalidf("%s must be a list of {containerID, ifname}: %v", key.name, err)
		}
		c.HasValidAttachments = true
		c.ValidAttachments = append(c.ValidAttachments, list...)
	}
	return nil
}

// setFlannelDataDir sets FlannelDataDir from its key: absent or "" leaves
// it off; a path must be absolute and must not be dataDir, whose entries
// would otherwise be taken for flannel's (files named like a container ID)
// and removed by GC.
func (c *NetConf) setFlannelDataDir(raw *string) error {
	if raw == nil || *raw == "" {
		return nil
	}
	dir, err := absPath("flannelDataDir", *raw)
	if err != nil {
		return err
	}
	if dir == c.DataDir {
		return invalidf("flannelDataDir %q is also dataDir: flannel's cache and overlay-cni's must be different directories", *raw)
	}
	c.FlannelDataDir = dir
	return nil
}

// takeDelegateKeys moves the keys of "delegate" that are not passed through
// to their place: type is validated, ipam becomes the ipam base, and the
// keys that are always overlay-cni's are dropped.
func (c *NetConf) takeDelegateKeys() error {
	if c.Delegate == nil {
		c.Delegate = map[string]json.RawMessage{}
	}
	if t, ok := c.Delegate["type"]; ok && !isAbsent(t) {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return invalidf("delegate.type must be a string: %v", err)
		}
		if !validPluginName(s) {
			return invalidf("delegate.type %q is not a plugin name (letters, digits, '-', '_', '.'; no path)", s)
		}
		c.DelegateType = s
	}
	if b, ok := c.Delegate["bridge"]; ok && !isAbsent(b) {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return invalidf("delegate.bridge must be a string: %v", err)
		}
	}
	if ipam, ok := c.Delegate["ipam"]; ok && !isAbsent(ipam) {
		if c.IPAM != nil {
			return invalidf("ipam is set both at the top level and in delegate: set it in one place")
		}
		m, err := object("delegate.ipam", ipam)
		if err != nil {
			return err
		}
		c.IPAM = m
	}
	for k := range c.Delegate {
		switch {
		case k == "type" || k == "name" || k == "cniVersion" || k == "ipam" || k == "prevResult",
			len(k) >= len(cniDevPrefix) && strings.EqualFold(k[:len(cniDevPrefix)], cniDevPrefix):
			delete(c.Delegate, k)
		case isAbsent(c.Delegate[k]):
			delete(c.Delegate, k) // null means "use the default"
		}
	}
	return rejectAliases("delegate", c.Delegate, delegateOwnKeys)
}

// cniDevPrefix starts the keys the CNI spec reserves for the runtime
// (cni.dev/valid-attachments and the like); the delegate never gets the
// user's.
const cniDevPrefix = "cni.dev/"

// The keys overlay-cni sets, defaults or replaces in the delegate's
// configuration and in its ipam section (see Render).
//
// The delegates decode their configuration with encoding/json, which matches
// object keys to fields ignoring case (strings.EqualFold: "cniversion",
// "CNIVERSION" and, with U+017F, "ſubnet" all match) and keeps the value of
// the last matching key. Render writes keys sorted, so a user's "cniversion"
// comes after, and would override for the delegate, overlay-cni's
// "cniVersion"; "ranges" would be replaced by a user's "rangeſ", and
// host-local would keep its reservations in a user's "datadir" while GC
// sweeps the "dataDir" it knows. Such aliases are refused.
var (
	delegateOwnKeys = []string{"type", "name", "cniVersion", "ipam", "prevResult", "runtimeConfig", "args",
		"bridge", "mtu", "ipMasq", "isGateway", "forceAddress"}
	ipamOwnKeys = append([]string{"type", "ranges", "routes", "dataDir"}, legacyRangeKeys...)
)

// rejectAliases refuses a key of m that differs from one of own only in
// letter case (as encoding/json folds it).
func rejectAliases(field string, m map[string]json.RawMessage, own []string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, o := range own {
			if k != o && strings.EqualFold(k, o) {
				return invalidf("%s key %q differs from %q only in letter case, and the delegate reads JSON keys ignoring case: write %q", field, k, o, o)
			}
		}
	}
	return nil
}

// HostLocalDir returns the directory where host-local keeps this network's
// reservations: <ipam.dataDir or /var/lib/cni/networks>/<name>.
func (c *NetConf) HostLocalDir() string {
	dir := HostLocalDefaultDataDir
	if raw, ok := c.IPAM["dataDir"]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			dir = s
		}
	}
	return filepath.Join(dir, c.Name)
}

// userRoute is one route of the user's ipam.routes: kept raw, with its
// destination and gateway parsed for validation and de-duplication.
type userRoute struct {
	dst netip.Prefix
	gw  string
	raw json.RawMessage
}

// ipamRoutes parses ipam.routes of the base: each route's dst is an IPv4
// or IPv6 CIDR, its gw (if any) an address of the same family. Whether the
// host has a lease of that family (so the pod has a source to route from)
// is known only at Render.
func ipamRoutes(ipam map[string]json.RawMessage) ([]userRoute, error) {
	raw, ok := ipam["routes"]
	if !ok || isAbsent(raw) {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalidf("ipam.routes must be a list of {\"dst\": CIDR}: %v", err)
	}
	routes := make([]userRoute, 0, len(list))
	for i, r := range list {
		var fields struct {
			Dst *string `json:"dst"`
			GW  *string `json:"gw"`
		}
		if err := json.Unmarshal(r, &fields); err != nil {
			return nil, invalidf("ipam.routes[%d] must be an object with a string dst: %v", i, err)
		}
		if isAbsent(r) || fields.Dst == nil {
			return nil, invalidf("ipam.routes[%d] has no dst", i)
		}
		dst, err := netip.ParsePrefix(*fields.Dst)
		if err != nil || dst.Addr().Is4In6() || dst.Addr().Zone() != "" {
			return nil, invalidf("ipam.routes[%d].dst %q is not an IPv4 or IPv6 CIDR", i, *fields.Dst)
		}
		ur := userRoute{dst: dst.Masked(), raw: r}
		if fields.GW != nil {
			gw, err := netip.ParseAddr(*fields.GW)
			if err != nil || gw.Is4() != dst.Addr().Is4() || gw.Is4In6() || gw.Zone() != "" {
				return nil, invalidf("ipam.routes[%d].gw %q is not an address of the family of dst %s", i, *fields.GW, dst)
			}
			ur.gw = gw.String()
		}
		routes = append(routes, ur)
	}
	return routes, nil
}

func validateIPAM(ipam map[string]json.RawMessage) error {
	if ipam == nil {
		return nil
	}
	if err := rejectAliases("ipam", ipam, ipamOwnKeys); err != nil {
		return err
	}
	if raw, ok := ipam["dataDir"]; ok && !isAbsent(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalidf("ipam.dataDir must be a string: %v", err)
		}
		if _, err := absPath("ipam.dataDir", s); err != nil {
			return err
		}
	}
	_, err := ipamRoutes(ipam)
	return err
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// absPath validates a configured path: absolute (a relative one would depend
// on the runtime's working directory) and free of NUL.
func absPath(field, p string) (string, error) {
	if p == "" || !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", invalidf("%s %q must be an absolute path", field, p)
	}
	return filepath.Clean(p), nil
}

// isAbsent reports whether a raw JSON value is missing or null.
func isAbsent(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// object decodes a JSON object into raw values; nil when absent or null.
func object(field string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	if isAbsent(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, invalidf("%s must be a JSON object: %v", field, err)
	}
	return m, nil
}

// objectRaw checks that raw is a JSON object and returns it (nil when absent
// or null).
func objectRaw(field string, raw json.RawMessage) (json.RawMessage, error) {
	if _, err := object(field, raw); err != nil || isAbsent(raw) {
		return nil, err
	}
	return raw, nil
}

// validPluginName accepts what invoke.FindInPath can look up safely: a plain
// file name, never a path.
func validPluginName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 255 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return false
		}
	}
	return true
}
