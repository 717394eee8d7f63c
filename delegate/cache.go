package delegate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/overlaynet/overlay/internal/lib/atomicfile"
)

// Modes of the cache (DESIGN.md §7): the configurations may carry runtime
// arguments (pod names, port mappings), so only root reads them.
const (
	CacheDirMode  os.FileMode = 0o700
	CacheFileMode os.FileMode = 0o600
	// CacheFormat is the version of the cache file format.
	CacheFormat = 1
	// maxCacheFile bounds what a read accepts; real entries are ~1 KiB.
	maxCacheFile = 1 << 20
	// maxFileName bounds the cache file's name: atomicfile.Write creates
	// ".<name>.tmp-<up to 10 digits>" next to it, and that name too must fit
	// in NAME_MAX (255), or every ADD of the attachment would fail with an
	// I/O error although its names were accepted.
	maxFileName = 255 - len(".") - len(".tmp-") - 10
)

var (
	// ErrInvalidAttachment marks a network name, container ID or interface
	// name that cannot name a cache file safely.
	ErrInvalidAttachment = errors.New("invalid attachment")
	// ErrCacheCorrupt marks a cache file that cannot be used.
	ErrCacheCorrupt = errors.New("corrupt cache entry")
	// errOtherAttachment (which wraps ErrCacheCorrupt) marks a whole entry
	// of another attachment at this one's path, which is that attachment's
	// path too: "<net>-<cid>-<if>" is ambiguous when IDs hold dashes. It
	// is unusable here but not garbage: DEL must leave it to its owner.
	errOtherAttachment = fmt.Errorf("%w: it belongs to another attachment", ErrCacheCorrupt)
)

// Attachment identifies one interface of one container on one network: the
// key of the cache, and of host-local's reservations.
type Attachment struct {
	Network     string
	ContainerID string
	IfName      string
}

func (a Attachment) String() string {
	return fmt.Sprintf("network %q container %q interface %q", a.Network, a.ContainerID, a.IfName)
}

// Validate rejects anything that could make the cache file name escape the
// cache directory or collide: empty names, '/', NUL, "..", and whatever the
// CNI library itself refuses in network names, container IDs and interface
// names.
func (a Attachment) Validate() error {
	for _, f := range []struct{ what, val string }{
		{"network name", a.Network}, {"container ID", a.ContainerID}, {"interface name", a.IfName},
	} {
		if err := checkNamePart(f.what, f.val); err != nil {
			return err
		}
	}
	if err := utils.ValidateNetworkName(a.Network); err != nil {
		return fmt.Errorf("%w: network name %q: %s", ErrInvalidAttachment, a.Network, err.Msg)
	}
	if err := validateContainerID(a.ContainerID); err != nil {
		return err
	}
	if err := utils.ValidateInterfaceName(a.IfName); err != nil {
		return fmt.Errorf("%w: interface name %q: %s", ErrInvalidAttachment, a.IfName, err.Msg)
	}
	if n := len(a.fileName()); n > maxFileName {
		return fmt.Errorf("%w: cache file name would be %d bytes long (at most %d)", ErrInvalidAttachment, n, maxFileName)
	}
	return nil
}

// checkNamePart refuses a value that could not be part of a file name
// safely: empty, with NUL, a path separator or "..".
func checkNamePart(what, val string) error {
	switch {
	case val == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidAttachment, what)
	case strings.ContainsRune(val, 0):
		return fmt.Errorf("%w: %s %q contains NUL", ErrInvalidAttachment, what, val)
	case strings.ContainsAny(val, `/\`):
		return fmt.Errorf("%w: %s %q contains a path separator", ErrInvalidAttachment, what, val)
	case strings.Contains(val, ".."):
		return fmt.Errorf("%w: %s %q contains \"..\"", ErrInvalidAttachment, what, val)
	}
	return nil
}

// validateContainerID accepts what the CNI library accepts as a container
// ID, and what can name a file (flannel's cache names its files by it).
func validateContainerID(id string) error {
	if err := checkNamePart("container ID", id); err != nil {
		return err
	}
	if err := utils.ValidateContainerID(id); err != nil {
		return fmt.Errorf("%w: container ID %q: %s", ErrInvalidAttachment, id, err.Msg)
	}
	return nil
}

// fileName is the cache file's name: <network>-<containerID>-<ifname>.
func (a Attachment) fileName() string { return a.Network + "-" + a.ContainerID + "-" + a.IfName }

// Entry is one cached attachment.
type Entry struct {
	Attachment
	Delegate Delegate
}

// cacheFile is the on-disk form: the rendered delegate configuration, byte
// for byte, with the attachment it belongs to (GC needs the container ID and
// interface name back, and "-" may appear in both) and the lease it was
// rendered from.
type cacheFile struct {
	Format      int             `json:"format"`
	Network     string          `json:"network"`
	ContainerID string          `json:"containerID"`
	IfName      string          `json:"ifName"`
	Lease       string          `json:"lease,omitempty"`     // absent on IPv6-only hosts only
	IPv6Lease   string          `json:"ipv6Lease,omitempty"` // hosts in a network that carries IPv6 only
	Config      json.RawMessage `json:"config"`
}

// Cache stores rendered delegate configurations under Dir, one file per
// attachment, so that DEL replays exactly what ADD used.
type Cache struct {
	Dir string
}

// Path returns the cache file of a, after validating a.
func (c Cache) Path(a Attachment) (string, error) {
	if err := a.Validate(); err != nil {
		return "", err
	}
	dir := filepath.Clean(c.Dir)
	p := filepath.Join(dir, a.fileName())
	if filepath.Dir(p) != dir { // cannot happen after Validate; kept as the last line of defence
		return "", fmt.Errorf("%w: %s escapes %s", ErrInvalidAttachment, p, dir)
	}
	return p, nil
}

// Write stores d for a atomically and durably (Publish, then Sync).
func (c Cache) Write(a Attachment, d Delegate) error {
	pending, err := c.Publish(a, d)
	if err != nil {
		return err
	}
	if err := pending.Sync(); err != nil {
		return fmt.Errorf("write cache entry: %w", err)
	}
	return nil
}

// Publish stores d for a, creating the directory with mode 0700; the file
// gets mode 0600. An existing entry is never replaced: that is an error
// wrapping atomicfile.ErrExist. When it returns, every reader finds the complete
// entry (temporary file, link); the returned Pending's Sync makes it survive a
// power loss, so ADD can overlap the fsyncs with the delegate's work. An
// entry emptied by a power loss before then is read as corrupt, and DEL
// then re-renders the configuration instead.
func (c Cache) Publish(a Attachment, d Delegate) (*atomicfile.Pending, error) {
	p, err := c.Path(a)
	if err != nil {
		return nil, err
	}
	f := cacheFile{
		Format: CacheFormat, Network: a.Network, ContainerID: a.ContainerID, IfName: a.IfName,
		Config: d.Config,
	}
	if d.Lease.IsValid() {
		f.Lease = d.Lease.String()
	}
	if d.IPv6Lease.IsValid() {
		f.IPv6Lease = d.IPv6Lease.String()
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode cache entry for %s: %w", a, err)
	}
	if err := ensureDir(c.Dir); err != nil {
		return nil, err
	}
	pending, err := atomicfile.Publish(p, data, CacheFileMode)
	if err != nil {
		return nil, fmt.Errorf("write cache entry: %w", err)
	}
	return pending, nil
}

// ensureDir creates dir with mode 0700, or tightens an existing one.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, CacheDirMode); err != nil {
		return fmt.Errorf("create cache directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("create cache directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("cache directory %s is not a directory", dir)
	}
	if fi.Mode().Perm() != CacheDirMode {
		if err := os.Chmod(dir, CacheDirMode); err != nil {
			return fmt.Errorf("set mode of cache directory: %w", err)
		}
	}
	return nil
}

// Read returns the cached entry of a. A missing entry wraps fs.ErrNotExist;
// one that cannot be used (truncated, not JSON, for another attachment)
// wraps ErrCacheCorrupt.
func (c Cache) Read(a Attachment) (Entry, error) {
	p, err := c.Path(a)
	if err != nil {
		return Entry{}, err
	}
	data, err := readLimited(p)
	if err != nil {
		return Entry{}, fmt.Errorf("read cache entry: %w", err)
	}
	e, err := decodeEntry(data)
	if err != nil {
		return Entry{}, fmt.Errorf("cache entry %s: %w", p, err)
	}
	switch {
	case e.Attachment != a && e.fileName() == a.fileName():
		return Entry{}, fmt.Errorf("cache entry %s: %w: %s", p, errOtherAttachment, e.Attachment)
	case e.Attachment != a: // a file copied or moved here: garbage
		return Entry{}, fmt.Errorf("cache entry %s: %w: it names %s", p, ErrCacheCorrupt, e.Attachment)
	}
	return e, nil
}

// readLimited reads the cache file p. Only a regular file is an entry: a
// symbolic link (the cache never writes one), a FIFO (whose open would block
// forever), a device or a directory wraps ErrCacheCorrupt, and so does a
// file larger than maxCacheFile. Nothing but p itself is ever opened.
func readLimited(p string) ([]byte, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: not a regular file (%v)", p, ErrCacheCorrupt, fi.Mode().Type())
	}
	data, err := readRegular(p, maxCacheFile, syscall.O_NOFOLLOW)
	if errors.Is(err, errNotRegular) || errors.Is(err, errTooLarge) || errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: %w: %v", p, ErrCacheCorrupt, err)
	}
	return data, err
}

var (
	errNotRegular = errors.New("not a regular file")
	errTooLarge   = errors.New("file too large")
)

// readRegular reads the regular file p, at most max bytes (errTooLarge
// beyond). It opens p non-blocking and checks what it opened, so that a FIFO
// or a device put where a file is expected gives errNotRegular instead of
// blocking forever (or reading /dev/zero until memory runs out); callers
// that must not even open such a file Lstat or Stat it first. flags are
// added to O_RDONLY (e.g. O_NOFOLLOW).
func readRegular(p string, max int64, flags int) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC|flags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%v)", p, errNotRegular, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", p, errTooLarge, max)
	}
	return data, nil
}

// decodeEntry parses and checks a cache file.
func decodeEntry(data []byte) (Entry, error) {
	var f cacheFile
	if len(bytes.TrimSpace(data)) == 0 {
		return Entry{}, fmt.Errorf("%w: empty file", ErrCacheCorrupt)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrCacheCorrupt, err)
	}
	if f.Format != CacheFormat {
		return Entry{}, fmt.Errorf("%w: format %d, want %d", ErrCacheCorrupt, f.Format, CacheFormat)
	}
	a := Attachment{Network: f.Network, ContainerID: f.ContainerID, IfName: f.IfName}
	if err := a.Validate(); err != nil {
		return Entry{}, fmt.Errorf("%w: %v", ErrCacheCorrupt, err)
	}
	var lease, lease6 netip.Prefix
	var err error
	if f.Lease != "" || f.IPv6Lease == "" {
		if lease, err = netip.ParsePrefix(f.Lease); err != nil || !lease.Addr().Is4() {
			return Entry{}, fmt.Errorf("%w: lease %q is not an IPv4 prefix", ErrCacheCorrupt, f.Lease)
		}
	}
	if f.IPv6Lease != "" {
		if lease6, err = netip.ParsePrefix(f.IPv6Lease); err != nil || !lease6.Addr().Is6() {
			return Entry{}, fmt.Errorf("%w: ipv6Lease %q is not an IPv6 prefix", ErrCacheCorrupt, f.IPv6Lease)
		}
	}
	var conf struct {
		Type       string `json:"type"`
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
	}
	if isAbsent(f.Config) {
		return Entry{}, fmt.Errorf("%w: no delegate configuration", ErrCacheCorrupt)
	}
	if err := json.Unmarshal(f.Config, &conf); err != nil {
		return Entry{}, fmt.Errorf("%w: delegate configuration: %v", ErrCacheCorrupt, err)
	}
	if !validPluginName(conf.Type) || conf.Name != a.Network || conf.CNIVersion == "" {
		return Entry{}, fmt.Errorf("%w: delegate configuration lacks a valid type, name or cniVersion", ErrCacheCorrupt)
	}
	return Entry{Attachment: a, Delegate: Delegate{Type: conf.Type, Lease: lease, IPv6Lease: lease6, Config: f.Config}}, nil
}

// Remove deletes the entry of a; a missing entry is not an error.
func (c Cache) Remove(a Attachment) error {
	p, err := c.Path(a)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove cache entry: %w", err)
	}
	return nil
}

// Listed is one file of the cache directory that may belong to a network.
type Listed struct {
	// Path is the cache file.
	Path string
	// Entry is the decoded entry when Err is nil.
	Entry Entry
	// Err wraps ErrCacheCorrupt (or an I/O error) when the file could not
	// be used; such a file's name starts with "<network>-" but it may, in
	// principle, belong to another network whose name starts the same way.
	Err error
}

// List returns the entries of network: every regular file named
// "<network>-*" (temporary files of a write in progress start with "." and
// are skipped). Entries that decode but belong to another network are left
// out. A missing directory lists nothing.
func (c Cache) List(network string) ([]Listed, error) {
	des, err := os.ReadDir(c.Dir) // opened with O_DIRECTORY: a FIFO does not block it
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list cache directory: %w", err)
	}
	var out []Listed
	for _, de := range des {
		name := de.Name()
		if !de.Type().IsRegular() || !strings.HasPrefix(name, network+"-") {
			continue
		}
		l := Listed{Path: filepath.Join(c.Dir, name)}
		data, err := readLimited(l.Path)
		if err == nil {
			l.Entry, err = decodeEntry(data)
		}
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed meanwhile
		case err != nil:
			l.Err = fmt.Errorf("cache entry %s: %w", l.Path, err)
		case l.Entry.fileName() != name:
			// Whatever network it names, a file whose content is not the
			// entry its name says is corrupt, as Read finds it.
			l.Err = fmt.Errorf("cache entry %s: %w: it names %s", l.Path, ErrCacheCorrupt, l.Entry.Attachment)
		case l.Entry.Network != network:
			continue // the entry of a network whose name starts like ours
		}
		out = append(out, l)
	}
	return out, nil
}
