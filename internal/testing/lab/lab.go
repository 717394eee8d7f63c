package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// DefaultNetworkConfig is the network config a lab puts into etcd.
const DefaultNetworkConfig = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`

// Config describes a lab. Only Root (or BinDir and ConfList) is required.
type Config struct {
	// Root is the repository root: the binaries are in Root/bin (make build
	// plugins), the CNI config is Root/deploy/cni/10-overlay.conflist.
	Root string
	// BinDir holds overlayd and overlay-cni, and the upstream plugins in
	// BinDir/cni (default Root/bin).
	BinDir string
	// ConfList is the CNI network config list adapted for each host
	// (default Root/deploy/cni/10-overlay.conflist).
	ConfList string
	// Dir is the work directory (etcd data and socket, logs, subnet.env,
	// CNI caches). Empty: a new directory under os.TempDir, removed by
	// Close unless KeepDir.
	Dir     string
	KeepDir bool
	// Tag goes into every namespace name ("ovl<pid>-<tag>-h1") so several
	// labs can live in one process; empty gives "ovl<pid>-h1".
	Tag string
	// NetworkConfig is stored at <prefix>/config (default DefaultNetworkConfig).
	NetworkConfig string
	// KernelResync is overlayd's --kernel-resync (default 1s).
	KernelResync time.Duration
	// LogLevel is overlayd's --log-level (default debug: the logs are for
	// diagnosing failures).
	LogLevel string
	// RunArgs are appended to every `overlayd run`.
	RunArgs []string
}

// Lab is a cluster of simulated hosts: an underlay, an embedded etcd on a
// unix socket, one real `overlayd run` process per host, and pods attached
// through libcni with the real plugins.
type Lab struct {
	cfg      Config
	Dir      string
	Underlay *Underlay
	Etcd     *Etcd
	ownDir   bool
	cni      *libcni.CNIConfig
	conflist []byte // the template, as read

	mu     sync.Mutex
	nodes  []*Node
	closed bool
}

// labs are the run prefixes of the labs open in this process: two labs with
// the same prefix would delete each other's namespaces.
var (
	labsMu sync.Mutex
	labs   = map[string]bool{}
)

// New builds an empty lab: work directory, underlay, etcd with the network
// config. Add hosts with AddNode. Close removes everything, also after a
// failed New.
func New(ctx context.Context, cfg Config) (_ *Lab, err error) {
	if cfg.BinDir == "" {
		cfg.BinDir = filepath.Join(cfg.Root, "bin")
	}
	if cfg.ConfList == "" {
		cfg.ConfList = filepath.Join(cfg.Root, "deploy", "cni", "10-overlay.conflist")
	}
	if cfg.NetworkConfig == "" {
		cfg.NetworkConfig = DefaultNetworkConfig
	}
	if cfg.KernelResync == 0 {
		cfg.KernelResync = time.Second
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "debug"
	}
	for _, b := range []string{"overlayd", "overlay-cni", "cni/bridge", "cni/host-local", "cni/portmap"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("lab needs %s: run `make build plugins` first: %w", filepath.Join(cfg.BinDir, b), err)
		}
	}
	conflist, err := os.ReadFile(cfg.ConfList)
	if err != nil {
		return nil, fmt.Errorf("read the CNI config: %w", err)
	}
	if _, err := libcni.ConfListFromBytes(conflist); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.ConfList, err)
	}
	run := runPrefix(cfg.Tag)
	labsMu.Lock()
	if labs[run] {
		labsMu.Unlock()
		return nil, fmt.Errorf("a lab with namespace prefix %q is already open in this process: give each lab its own Tag", run)
	}
	labs[run] = true
	labsMu.Unlock()

	l := &Lab{cfg: cfg, conflist: conflist}
	defer func() {
		if err != nil {
			_ = l.Close()
		}
	}()
	if l.Dir = cfg.Dir; l.Dir == "" {
		// The PID in the name lets a later run remove it if this process
		// dies; a directory to keep has none.
		pattern := dirPrefix + strconv.Itoa(os.Getpid()) + "-"
		if cfg.KeepDir {
			pattern = dirPrefix + "kept-"
		}
		if l.Dir, err = os.MkdirTemp("", pattern); err != nil {
			return nil, fmt.Errorf("lab work directory: %w", err)
		}
		l.ownDir = true
	} else if err := os.MkdirAll(l.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("lab work directory: %w", err)
	}
	if l.Underlay, err = NewUnderlay(cfg.Tag); err != nil {
		return nil, fmt.Errorf("lab underlay: %w", err)
	}
	l.cni = libcni.NewCNIConfigWithCacheDir([]string{cfg.BinDir, filepath.Join(cfg.BinDir, "cni")},
		filepath.Join(l.Dir, "libcni"),
		// Made up front: libcni creates its own lazily, which races when
		// one CNIConfig serves concurrent requests.
		testenv.CNIExec(os.Stderr))
	l.Etcd = newEtcd(l.Dir)
	if err := l.Etcd.Start(ctx); err != nil {
		return nil, err
	}
	if err := l.Etcd.putConfig(ctx, cfg.NetworkConfig); err != nil {
		return nil, err
	}
	return l, nil
}

// Run is the prefix of every namespace of the lab, e.g. "ovl1234-".
func (l *Lab) Run() string { return l.Underlay.Run }

// Endpoint is the etcd client URL for --endpoints.
func (l *Lab) Endpoint() string { return l.Etcd.Endpoint() }

// Binary returns the path of one of the lab's binaries ("overlayd").
func (l *Lab) Binary(name string) string { return filepath.Join(l.cfg.BinDir, name) }

// Nodes returns the hosts in the order they were added.
func (l *Lab) Nodes() []*Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Node(nil), l.nodes...)
}

// Node returns the host called name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.Nodes() {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Pods returns every pod of every host.
func (l *Lab) Pods() []*Pod {
	var out []*Pod
	for _, n := range l.Nodes() {
		out = append(out, n.Pods()...)
	}
	return out
}

// Close deletes every pod (CNI DEL), stops every overlayd it started
// (SIGTERM, then SIGKILL), stops etcd, deletes every namespace of the run
// and the work directory. Safe to call twice.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	nodes := l.nodes
	l.mu.Unlock()
	// Hosts are independent: stop them in parallel (a SIGTERM'd overlayd
	// may take a moment to exit).
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.close() })
	}
	wg.Wait()
	if l.Etcd != nil {
		l.Etcd.Stop()
	}
	if l.Underlay != nil {
		errs = append(errs, l.Underlay.Close())
		if left := namespacesWithPrefix(l.Run()); len(left) > 0 {
			errs = append(errs, fmt.Errorf("namespaces left after closing the lab: %s", strings.Join(left, " ")))
		}
	}
	labsMu.Lock()
	delete(labs, runPrefix(l.cfg.Tag))
	labsMu.Unlock()
	if l.ownDir && !l.cfg.KeepDir && l.Dir != "" {
		errs = append(errs, os.RemoveAll(l.Dir))
	}
	return errors.Join(errs...)
}

// CLI runs `overlayd --endpoints=<lab etcd> args...` and returns its
// standard output; an error carries the exit status and standard error. It
// runs in the caller's namespace: it only talks to etcd's unix socket.
func (l *Lab) CLI(ctx context.Context, args ...string) (string, error) {
	return runCLI(ctx, l.Binary("overlayd"), append([]string{"--endpoints=" + l.Endpoint()}, args...))
}

func runCLI(ctx context.Context, bin string, args []string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = testenv.ProgramEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("overlayd %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// LeaseList is `overlayd lease list -w json`.
type LeaseList struct {
	Revision int64             `json:"revision"`
	Leases   []LeaseRow        `json:"leases"`
	Invalid  []json.RawMessage `json:"invalid"`
}

// LeaseRow is one lease of LeaseList.
type LeaseRow struct {
	Subnet      string `json:"subnet"`
	PublicIP    string `json:"publicIP"`
	VtepMAC     string `json:"vtepMAC"`
	IPv6Subnet  string `json:"ipv6Subnet"` // "" unless the key is dual-stack
	PublicIPv6  string `json:"publicIPv6"`
	VtepMACv6   string `json:"vtepMACv6"`
	NodeID      string `json:"nodeID"`
	Hostname    string `json:"hostname"`
	Reserved    bool   `json:"reserved"`
	TTLSeconds  int64  `json:"ttlSeconds"`
	Alive       string `json:"alive"` // yes, no or unknown
	EtcdLease   string `json:"etcdLease"`
	ModRevision int64  `json:"modRevision"`
	State       string `json:"state"` // leased, reserved, ipv4-only, orphaned, invalid or unknown
}

// Leases runs `overlayd lease list -w json`.
func (l *Lab) Leases(ctx context.Context) (LeaseList, error) {
	var ll LeaseList
	out, err := l.CLI(ctx, "lease", "list", "-w", "json")
	if err != nil {
		return ll, err
	}
	if err := json.Unmarshal([]byte(out), &ll); err != nil {
		return ll, fmt.Errorf("decode `overlayd lease list -w json`: %w: %q", err, out)
	}
	return ll, nil
}

// ByNode returns the lease of node, if listed.
func (ll LeaseList) ByNode(node string) (LeaseRow, bool) {
	for _, r := range ll.Leases {
		if r.NodeID == node {
			return r, true
		}
	}
	return LeaseRow{}, false
}

// LogTails returns the last lines of every host's overlayd log and of
// etcd's, for a failure report.
func (l *Lab) LogTails(lines int) string {
	var b strings.Builder
	files := []string{}
	for _, n := range l.Nodes() {
		files = append(files, n.LogFile)
	}
	if l.Etcd != nil {
		files = append(files, l.Etcd.LogFile())
	}
	for _, f := range files {
		tail, err := tailFile(f, lines)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			fmt.Fprintf(&b, "---- %s: %v\n", f, err)
		case tail == "":
			fmt.Fprintf(&b, "---- %s: empty\n", f)
		default:
			fmt.Fprintf(&b, "---- %s (last %d lines) ----\n%s", f, lines, tail)
		}
	}
	return b.String()
}

func tailFile(path string, lines int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ring := make([]string, 0, lines)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if len(ring) == lines {
			ring = ring[1:]
		}
		ring = append(ring, sc.Text())
	}
	if len(ring) == 0 {
		return "", sc.Err()
	}
	return strings.Join(ring, "\n") + "\n", sc.Err()
}
