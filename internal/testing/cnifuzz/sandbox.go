// Package cnifuzz is the sandbox of overlay-cni's fuzz targets (package
// delegate and cmd/overlay-cni): a temporary root holding every path a
// fuzzed network configuration may name, snapshots of that root, and the
// exact rule of which changes each CNI verb may make in it (Policy). It is
// imported only by tests.
//
// The guarantee it checks (Documentation/cni.md, "Hostile input"): the
// paths in the network configuration (dataDir, subnetFile, ipam.dataDir)
// are the administrator's and are used as given, cleaned; everything that
// comes from the runtime or the pod (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS,
// CNI_ARGS, CNI_PATH, the valid-attachments list, the content of cache
// files) only ever selects a file directly inside dataDir, or directly
// inside host-local's directory for GC, and never a path elsewhere.
package cnifuzz

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/overlaynet/overlay/subnet"
)

// Layout of a sandbox, relative to its root.
const (
	// EnvFile is a valid subnet.env (Lease of Network, MTU 1450, masquerading).
	EnvFile = "subnet.env"
	// DataDir is an existing cache directory with mode 0755 (ADD tightens it).
	DataDir = "data"
	// IPAMDir is host-local's dataDir; the network's directory in it is
	// created by PrepareHostLocal.
	IPAMDir = "ipam"
	// Outside is the decoy: files that no verb may ever change, among them
	// one named like a cache entry and the targets of dangling links.
	Outside = "outside"
	// Odd holds things that are not what a path in the configuration
	// should name: a FIFO, a directory, empty, garbage and oversized files,
	// a link to /dev/zero and a dangling link into Outside.
	Odd = "odd"
	// NetNS is a regular file standing for a network namespace.
	NetNS = "netns/pod"
)

// Lease and Network are those of the sandbox's subnet.env.
var (
	Network = netip.MustParsePrefix("10.244.0.0/16")
	Lease   = netip.MustParsePrefix("10.244.7.0/24")
)

// Sandbox is one fuzz case's root directory.
type Sandbox struct {
	Root string
}

// New creates a sandbox, on /dev/shm when it is writable (the cache fsyncs
// every write; on tmpfs that costs nothing) and in tb.TempDir otherwise. It
// is removed when the test or fuzz case ends.
func New(tb testing.TB) *Sandbox {
	tb.Helper()
	var root string
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() {
		removeOrphans.Do(removeOrphanSandboxes)
		if dir, err := os.MkdirTemp(shm, fmt.Sprintf("%s%d-", shmPrefix, os.Getpid())); err == nil {
			root = dir
			tb.Cleanup(func() {
				if err := os.RemoveAll(dir); err != nil {
					tb.Errorf("remove sandbox: %v", err)
				}
			})
		}
	}
	if root == "" {
		root = tb.TempDir()
	}
	s := &Sandbox{Root: root}
	mkdir := func(rel string, mode os.FileMode) {
		if err := os.MkdirAll(s.Path(rel), mode); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chmod(s.Path(rel), mode); err != nil {
			tb.Fatal(err)
		}
	}
	write := func(rel string, data []byte) {
		if err := os.WriteFile(s.Path(rel), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	symlink := func(target, rel string) {
		if err := os.Symlink(target, s.Path(rel)); err != nil {
			tb.Fatal(err)
		}
	}
	write(EnvFile, subnet.NewEnv(Network, Lease, 1450, true).Marshal())
	mkdir(DataDir, 0o755)
	write(DataDir+"/other-c9-eth0", []byte("an entry of network other"))
	mkdir(IPAMDir, 0o755)
	mkdir(Outside, 0o755)
	write(Outside+"/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"))
	write(Outside+"/secret", []byte("must never change"))
	write(Outside+"/overlay-c1-eth0", []byte(`{"format":1,"network":"overlay","containerID":"c1","ifName":"eth0"}`))
	mkdir(Odd, 0o755)
	mkdir(Odd+"/dir", 0o755)
	write(Odd+"/empty", nil)
	write(Odd+"/garbage", []byte("OVERLAY_NETWORK=\x00\xff\n{not json"))
	write(Odd+"/big", bytes.Repeat([]byte("# padding\n"), 10<<10))
	if err := syscall.Mkfifo(s.Path(Odd+"/fifo"), 0o600); err != nil {
		tb.Fatal(err)
	}
	symlink("/dev/zero", Odd+"/zero")
	symlink(s.Path(Outside+"/created-by-dangling"), Odd+"/dangling")
	mkdir(filepath.Dir(NetNS), 0o755)
	write(NetNS, nil)
	return s
}

const (
	shm       = "/dev/shm"
	shmPrefix = "overlay-cni-fuzz-"
)

var removeOrphans sync.Once

// removeOrphanSandboxes removes the sandboxes of test processes that are
// gone: a fuzz worker that is stopped in the middle of a case (as `go test
// -fuzz` does when -fuzztime is up) never runs the case's cleanup.
func removeOrphanSandboxes() {
	des, err := os.ReadDir(shm)
	if err != nil {
		return
	}
	for _, de := range des {
		rest, ok := strings.CutPrefix(de.Name(), shmPrefix)
		if !ok || !de.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(shm, de.Name()))
		}
	}
}

// Path returns rel inside the sandbox.
func (s *Sandbox) Path(rel string) string { return filepath.Join(s.Root, rel) }

// rooted maps a fuzzed string to a path for the configuration: a string
// that is not an absolute, NUL-free path is returned as it is (overlay-cni
// must refuse it), an absolute one is re-rooted under dir in the sandbox
// (with ".." resolved lexically first, as overlay-cni cleans it, so that it
// cannot climb out of the sandbox).
func (s *Sandbox) rooted(dir, free string) string {
	if !filepath.IsAbs(free) || strings.ContainsRune(free, 0) {
		return free
	}
	return s.Path(dir) + filepath.Clean(free)
}

// value is a JSON value for a path key of the configuration.
func value(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// nonStrings are the values of a path key that are not strings.
var nonStrings = []json.RawMessage{json.RawMessage(`123`), json.RawMessage(`{}`), json.RawMessage(`["/x"]`), json.RawMessage(`true`)}

// DataDirValue is the JSON value of "dataDir" for selector sel. good is
// true when it names a directory ADD can create or use.
func (s *Sandbox) DataDirValue(sel uint8, free string) (v json.RawMessage, good bool) {
	switch sel % 10 {
	case 0:
		return value(s.Path(DataDir)), true
	case 1:
		return value(s.Path(DataDir + "/new/sub")), true
	case 2:
		return value(s.Root), true // the decoy and subnet.env are in dataDir
	case 3:
		return value(s.Path(Odd + "/empty")), false
	case 4:
		return value(s.Path(Odd + "/fifo")), false
	case 5:
		return value(s.Path(Odd + "/dangling")), false
	case 6:
		return value(s.Path(Odd + "/zero")), false
	case 7:
		return value(s.Path(DataDir) + "/x/../../" + DataDir + "/./"), true // cleaned to data
	case 8:
		return value(s.rooted("free-data", free)), false
	default:
		return nonStrings[int(sel/10)%len(nonStrings)], false
	}
}

// SubnetFileValue is the JSON value of "subnetFile" for selector sel. good
// is true when it names the valid subnet.env.
func (s *Sandbox) SubnetFileValue(sel uint8, free string) (v json.RawMessage, good bool) {
	switch sel % 12 {
	case 0:
		return value(s.Path(EnvFile)), true
	case 1:
		return value(s.Path("missing.env")), false
	case 2:
		return value(s.Path(Odd + "/dir")), false
	case 3:
		return value(s.Path(Odd + "/empty")), false
	case 4:
		return value(s.Path(Odd + "/garbage")), false
	case 5:
		return value(s.Path(Odd + "/fifo")), false
	case 6:
		return value(s.Path(Odd + "/zero")), false
	case 7:
		return value(s.Path(Odd + "/big")), false
	case 8:
		return value(s.Path(Outside + "/passwd")), false
	case 9:
		return value(s.Path(Odd + "/dangling")), false
	case 10:
		return value(s.rooted("free-env", free)), false
	default:
		return nonStrings[int(sel/12)%len(nonStrings)], false
	}
}

// IPAMDataDirValue is the JSON value of ipam's "dataDir" for selector sel.
func (s *Sandbox) IPAMDataDirValue(sel uint8, free string) json.RawMessage {
	switch sel % 6 {
	case 0:
		return value(s.Path(IPAMDir))
	case 1:
		return value(s.Path("ipam-missing"))
	case 2:
		return value(s.Path(Odd + "/empty"))
	case 3:
		return value(s.Path(Odd + "/fifo"))
	case 4:
		return value(s.rooted("free-ipam", free))
	default:
		return nonStrings[int(sel/6)%len(nonStrings)]
	}
}

// NetNSValue is CNI_NETNS for selector sel. Only a path inside the sandbox
// or the process's own namespace is ever returned: the CNI library opens
// CNI_NETNS (and overlay-cni opens it for ADD), and opening an arbitrary
// path (a device) can have side effects. CNI_NETNS never names a file
// overlay-cni writes; it is passed to the delegate as it is.
func (s *Sandbox) NetNSValue(sel uint8, free string) string {
	switch sel % 8 {
	case 0:
		return ""
	case 1:
		return s.Path(NetNS)
	case 2:
		return s.Path(Odd + "/fifo")
	case 3:
		return "/proc/self/ns/net"
	case 4:
		return s.Path(Odd + "/zero")
	case 5:
		return s.Path(Odd + "/dir")
	case 6:
		return s.Path(NetNS) + "/../../" + Outside + "/passwd"
	default:
		return s.Path("free-netns") + filepath.Clean("/"+strings.ReplaceAll(free, "\x00", ""))
	}
}

// Confine returns the network configuration stdin with every key that
// names a path set to the given values, so that overlay-cni never uses a
// default outside the sandbox (/var/lib/cni/..., /run/overlay/...):
//
//   - top level: every key that encoding/json would take for "dataDir" or
//     "subnetFile" (it ignores case) is removed and the exact key set;
//   - ipam: in every top-level key that is an alias of "ipam" and holds an
//     object, and in delegate.ipam when it is an object, "dataDir" is set
//     (aliases of it are left alone: overlay-cni must refuse them); when
//     there is neither, a top-level ipam with only dataDir is added.
//
// stdin that is not a JSON object is returned as it is (overlay-cni must
// refuse it). The result's keys come out sorted.
func Confine(stdin []byte, dataDir, subnetFile, ipamDataDir json.RawMessage) []byte {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err != nil || top == nil {
		return stdin
	}
	for k := range top {
		// flannelDataDir is dropped: overlay-cni's DEL and GC remove files
		// there, and a fuzzed config must not point them outside the sandbox.
		if strings.EqualFold(k, "dataDir") || strings.EqualFold(k, "subnetFile") || strings.EqualFold(k, "flannelDataDir") {
			delete(top, k)
		}
	}
	top["dataDir"] = dataDir
	top["subnetFile"] = subnetFile
	setIPAM := func(raw json.RawMessage) (json.RawMessage, bool) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
			return raw, false
		}
		m["dataDir"] = ipamDataDir
		return value(m), true
	}
	found := false
	for k, v := range top {
		if strings.EqualFold(k, "ipam") {
			var ok bool
			top[k], ok = setIPAM(v)
			found = found || ok
		}
	}
	for k, v := range top {
		if !strings.EqualFold(k, "delegate") {
			continue
		}
		var d map[string]json.RawMessage
		if err := json.Unmarshal(v, &d); err != nil || d == nil {
			continue
		}
		if ipam, ok := d["ipam"]; ok {
			var set bool
			d["ipam"], set = setIPAM(ipam)
			found = found || set
			top[k] = value(d)
		}
	}
	if !found {
		if _, ok := top["ipam"]; !ok {
			top["ipam"] = value(map[string]json.RawMessage{"dataDir": ipamDataDir})
		}
	}
	return value(top)
}

// Within reports whether p is the sandbox root or inside it, lexically.
func (s *Sandbox) Within(p string) bool {
	rel, err := filepath.Rel(s.Root, p)
	return err == nil && filepath.IsAbs(p) && rel != ".." && !strings.HasPrefix(rel, "../")
}

// PrepareHostLocal creates host-local's directory dir (if its parent is a
// directory and dir does not exist) with a lock, a last_reserved_ip, two
// reservations (10.244.7.2 for c1/eth0 and 10.244.7.3 for stale/eth0), a
// file not named like an address, and a link named like an address pointing
// into the decoy. With hostileLock, lock is instead a dangling link into
// the decoy: GC must not create its target.
func (s *Sandbox) PrepareHostLocal(dir string, hostileLock bool) {
	if fi, err := os.Stat(filepath.Dir(dir)); err != nil || !fi.IsDir() {
		return
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return
	}
	files := [][2]string{
		{"last_reserved_ip.0", "10.244.7.3"},
		{"10.244.7.2", "c1\r\neth0"},
		{"10.244.7.3", "stale\r\neth0"},
		{"README", "not a reservation"},
	}
	if !hostileLock {
		files = append(files, [2]string{"lock", ""})
	} else {
		_ = os.Symlink(s.Path(Outside+"/created-by-lock"), filepath.Join(dir, "lock"))
	}
	for _, f := range files {
		_ = os.WriteFile(filepath.Join(dir, f[0]), []byte(f[1]), 0o644)
	}
	_ = os.Symlink(s.Path(Outside+"/secret"), filepath.Join(dir, "10.244.7.4"))
}

// FileState is what a snapshot records of one path (never its atime: reads
// are allowed).
type FileState struct {
	Type  fs.FileMode // fs.ModeType bits
	Perm  fs.FileMode
	Size  int64
	MTime int64
	Inode uint64
	Data  string // regular files of at most maxRecorded bytes
	Link  string // symbolic links only
}

// maxRecorded bounds the files whose content a snapshot keeps; a larger one
// is compared by inode, size and mtime (the sandbox's only one is Odd/big).
const maxRecorded = 16 << 10

// Snapshot maps every path under the root (the root included) to its state.
type Snapshot map[string]FileState

// Snapshot records the sandbox. It only reads regular files and links:
// never a FIFO or a device.
func (s *Sandbox) Snapshot(tb testing.TB) Snapshot {
	tb.Helper()
	snap := Snapshot{}
	err := filepath.WalkDir(s.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := FileState{Type: fi.Mode().Type(), Perm: fi.Mode().Perm(), Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.Inode = sys.Ino
		}
		switch {
		case fi.Mode().IsRegular() && fi.Size() <= maxRecorded:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			st.Data = string(data)
		case fi.Mode()&fs.ModeSymlink != 0:
			if st.Link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		snap[p] = st
		return nil
	})
	if err != nil {
		tb.Fatalf("snapshot of the sandbox: %v", err)
	}
	return snap
}

// Change kinds.
const (
	Created  = "created"
	Removed  = "removed"
	Modified = "modified" // another file, other content or type
	Chmod    = "chmod"    // same file, other permissions
	Entries  = "entries"  // a directory whose entries changed (only its mtime)
)

// Change is one difference between two snapshots.
type Change struct {
	Path string
	Kind string
	// Before and After are the states (zero when absent).
	Before, After FileState
}

func (c Change) String() string { return c.Kind + " " + c.Path }

// Diff lists what changed from a to b, sorted by path.
func Diff(a, b Snapshot) []Change {
	var out []Change
	for p, x := range a {
		y, ok := b[p]
		switch {
		case !ok:
			out = append(out, Change{Path: p, Kind: Removed, Before: x})
		case x.Type != y.Type || x.Inode != y.Inode || x.Data != y.Data || x.Link != y.Link ||
			(x.Type&fs.ModeDir == 0 && (x.Size != y.Size || x.MTime != y.MTime)):
			out = append(out, Change{Path: p, Kind: Modified, Before: x, After: y})
		case x.Perm != y.Perm:
			out = append(out, Change{Path: p, Kind: Chmod, Before: x, After: y})
		case x.MTime != y.MTime:
			out = append(out, Change{Path: p, Kind: Entries, Before: x, After: y})
		}
	}
	for p, y := range b {
		if _, ok := a[p]; !ok {
			out = append(out, Change{Path: p, Kind: Created, After: y})
		}
	}
	slices.SortFunc(out, func(x, y Change) int { return strings.Compare(x.Path, y.Path) })
	return out
}

// Policy is what one verb may change, for a configuration whose cleaned
// dataDir is DataDir and whose host-local directory is HostLocalDir:
//
//   - ADD: create DataDir and its missing parents (directories only),
//     tighten DataDir's mode, and create, replace or remove exactly one
//     file: DataDir + "/" + Network + "-" + ContainerID + "-" + IfName,
//     built from the values as the runtime gave them, which must name a
//     file directly in DataDir (so a ContainerID or IfName with "/" or
//     "..", were it accepted, could not match). Temporary files must be gone.
//   - DEL: remove exactly that file.
//   - CHECK, STATUS, VERSION: nothing.
//   - GC: remove regular files directly in DataDir whose name starts with
//     Network + "-"; create HostLocalDir/lock; remove regular files directly
//     in HostLocalDir whose name is an IP address.
//
// A directory whose entries changed only counts when an allowed change was
// made in it.
type Policy struct {
	Verb         string
	DataDir      string
	HostLocalDir string
	Network      string
	ContainerID  string
	IfName       string
}

// Check returns an error listing every change the policy does not allow.
func (p Policy) Check(changes []Change) error {
	entry := p.DataDir + "/" + p.Network + "-" + p.ContainerID + "-" + p.IfName
	isEntry := func(path string) bool {
		return path == entry && filepath.Dir(path) == p.DataDir
	}
	isDataDirOrParent := func(path string) bool {
		return path == p.DataDir || strings.HasPrefix(p.DataDir, path+"/")
	}
	var bad []string
	for _, c := range changes {
		ok := false
		switch p.Verb {
		case "ADD":
			switch c.Kind {
			case Created:
				ok = isEntry(c.Path) && c.After.Type.IsRegular() ||
					isDataDirOrParent(c.Path) && c.After.Type.IsDir()
			case Modified:
				ok = isEntry(c.Path) && c.After.Type.IsRegular() && c.Before.Type.Type()&fs.ModeDir == 0
			case Removed:
				ok = isEntry(c.Path)
			case Chmod:
				ok = c.Path == p.DataDir
			case Entries:
				ok = isDataDirOrParent(c.Path)
			}
		case "DEL":
			switch c.Kind {
			case Removed:
				ok = isEntry(c.Path)
			case Entries:
				ok = c.Path == p.DataDir
			}
		case "GC":
			dir, base := filepath.Dir(c.Path), filepath.Base(c.Path)
			switch c.Kind {
			case Removed:
				ok = c.Before.Type.IsRegular() &&
					(dir == p.DataDir && strings.HasPrefix(base, p.Network+"-") ||
						dir == p.HostLocalDir && isAddr(base))
			case Created:
				ok = c.Path == filepath.Join(p.HostLocalDir, "lock") && c.After.Type.IsRegular()
			case Entries:
				ok = c.Path == p.DataDir || c.Path == p.HostLocalDir
			}
		}
		if !ok {
			bad = append(bad, c.String())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s (dataDir %s, host-local %s, network %q, container %q, interface %q) made changes it may not: %s",
			p.Verb, p.DataDir, p.HostLocalDir, p.Network, p.ContainerID, p.IfName, strings.Join(bad, ", "))
	}
	return nil
}

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// ErrOutside is returned by CheckConfined for a configuration naming a path
// outside the sandbox.
var ErrOutside = errors.New("names a path outside the sandbox")

// CheckConfined returns ErrOutside unless every path is within the sandbox.
func (s *Sandbox) CheckConfined(paths map[string]string) error {
	keys := make([]string, 0, len(paths))
	for k := range paths {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !s.Within(paths[k]) {
			return fmt.Errorf("%s %q %w %s", k, paths[k], ErrOutside, s.Root)
		}
	}
	return nil
}
