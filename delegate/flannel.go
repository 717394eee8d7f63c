package delegate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"
)

// Pods added by flannel's CNI plugin (flannel-io/cni-plugin, v1.x) before a
// host's conflist switched to overlay-cni. That plugin renders a delegate
// configuration much like ours, writes it — compact JSON, keys sorted, no
// envelope — to <its dataDir>/<containerID> before running the delegate,
// and its DEL replays that file through the delegate named by its "type"
// and then removes it. The runtime's DEL of such a pod now reaches
// overlay-cni, which has no entry of its own for it: the file is what
// releases the pod's address and veth exactly as they were made.
//
// The file is read as untrusted input: a regular file of at most
// maxCacheFile bytes, never followed through a link, holding a JSON object
// with a plain plugin name as "type", a valid network name as "name" (the
// network being deleted: see FlannelCache.Read) and host-local's "ranges"
// as flannel writes them. Anything else is corrupt, and handled as a
// corrupt entry of our own is.

// ErrOtherNetwork marks a flannel cache file of the container that names
// another network than the one asked about.
var ErrOtherNetwork = errors.New("flannel cache entry of another network")

// FlannelCache reads and removes the entries of flannel's CNI plugin's
// cache in Dir; it never writes one.
type FlannelCache struct {
	Dir string
}

// Path returns the entry of containerID: flannel keys it by container ID
// alone (no network, no interface name).
func (c FlannelCache) Path(containerID string) (string, error) {
	if err := validateContainerID(containerID); err != nil {
		return "", err
	}
	return filepath.Join(filepath.Clean(c.Dir), containerID), nil
}

// Read returns flannel's entry of a as an Entry of a. A missing file wraps
// fs.ErrNotExist, an unusable one ErrCacheCorrupt, and one of another
// network ErrOtherNetwork: a DEL of network a.Network must not release what
// the container holds on another network (its runtime sends that network
// a DEL of its own), and with the network's name kept (Documentation/cni.md)
// every entry flannel left on the host names it.
func (c FlannelCache) Read(a Attachment) (Entry, error) {
	p, err := c.Path(a.ContainerID)
	if err != nil {
		return Entry{}, err
	}
	data, err := readLimited(p)
	if err != nil {
		return Entry{}, fmt.Errorf("read flannel cache entry: %w", err)
	}
	e, err := decodeFlannelEntry(data, a.ContainerID, a.IfName)
	if err != nil {
		return Entry{}, fmt.Errorf("flannel cache entry %s: %w", p, err)
	}
	if e.Network != a.Network {
		return Entry{}, fmt.Errorf("flannel cache entry %s: %w: it is for network %q, not %q", p, ErrOtherNetwork, e.Network, a.Network)
	}
	return e, nil
}

// Remove deletes the entry of a's container; a missing one is not an error.
func (c FlannelCache) Remove(a Attachment) error {
	p, err := c.Path(a.ContainerID)
	if err != nil {
		return err
	}
	return removeFile(p)
}

// flannelConf is what overlay-cni needs of a delegate configuration cached
// by flannel's plugin; the rest is the delegate's business.
type flannelConf struct {
	Type string `json:"type"`
	Name string `json:"name"`
	IPAM struct {
		Ranges [][]struct {
			Subnet string `json:"subnet"`
		} `json:"ranges"`
	} `json:"ipam"`
}

// decodeFlannelEntry checks a flannel cache file and returns it as the
// entry of (its network, containerID, ifName): flannel's file names no
// interface, so the one the runtime asks about is taken.
func decodeFlannelEntry(data []byte, containerID, ifName string) (Entry, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		// flannel writes the file in place (truncate, write, fsync): a
		// crash in between leaves it empty.
		return Entry{}, fmt.Errorf("%w: empty file", ErrCacheCorrupt)
	}
	var conf flannelConf
	if err := json.Unmarshal(data, &conf); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrCacheCorrupt, err)
	}
	if !validPluginName(conf.Type) {
		return Entry{}, fmt.Errorf("%w: type %q is not a plugin name", ErrCacheCorrupt, conf.Type)
	}
	if err := utils.ValidateNetworkName(conf.Name); err != nil || strings.Contains(conf.Name, "..") {
		return Entry{}, fmt.Errorf("%w: name %q is not a network name", ErrCacheCorrupt, conf.Name)
	}
	d := Delegate{Type: conf.Type, Config: data}
	if err := d.setLeases(conf); err != nil {
		return Entry{}, err
	}
	return Entry{Attachment: Attachment{Network: conf.Name, ContainerID: containerID, IfName: ifName}, Delegate: d}, nil
}

// setLeases takes the leases from host-local's ranges, as flannel writes
// them: one range set per family, its one range the host's lease
// (FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET). CHECK compares them with
// subnet.env's.
func (d *Delegate) setLeases(conf flannelConf) error {
	for i, set := range conf.IPAM.Ranges {
		if len(set) == 0 {
			return fmt.Errorf("%w: ipam.ranges[%d] is empty", ErrCacheCorrupt, i)
		}
		p, err := netip.ParsePrefix(set[0].Subnet)
		lease := &d.Lease
		if p.Addr().Is6() {
			lease = &d.IPv6Lease
		}
		if err != nil || p.Addr().Is4In6() || lease.IsValid() {
			return fmt.Errorf("%w: ipam.ranges[%d][0].subnet %q is not a lease of its own family", ErrCacheCorrupt, i, set[0].Subnet)
		}
		*lease = p.Masked()
	}
	if !d.Lease.IsValid() && !d.IPv6Lease.IsValid() {
		return fmt.Errorf("%w: ipam.ranges holds no lease", ErrCacheCorrupt)
	}
	return nil
}

// FlannelListed is one file of flannel's cache directory.
type FlannelListed struct {
	Path        string
	ContainerID string
	// Network is the network the entry names, when Err is nil.
	Network string
	// Err wraps ErrCacheCorrupt (or an I/O error) when the file could not
	// be used.
	Err error
}

// List returns the entries of flannel's cache: every regular file named
// like a container ID (flannel writes nothing else there). A missing
// directory lists nothing.
func (c FlannelCache) List() ([]FlannelListed, error) {
	des, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list flannel cache directory: %w", err)
	}
	var out []FlannelListed
	for _, de := range des {
		id := de.Name()
		if !de.Type().IsRegular() || validateContainerID(id) != nil {
			continue
		}
		l := FlannelListed{Path: filepath.Join(c.Dir, id), ContainerID: id}
		data, err := readLimited(l.Path)
		var e Entry
		if err == nil {
			e, err = decodeFlannelEntry(data, id, "")
		}
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed meanwhile
		case err != nil:
			l.Err = fmt.Errorf("flannel cache entry %s: %w", l.Path, err)
		}
		l.Network = e.Network
		out = append(out, l)
	}
	return out, nil
}
