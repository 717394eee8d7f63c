package runtimee2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// host is one lab host with the files its runtimes share: overlay's
// conflist (in a directory of its own, the runtimes' only CNI
// configuration), pointed at the host's subnet.env and at the cache and
// host-local directories the lab's own pods use, so that addresses never
// collide.
type host struct {
	*lab.Node
	netDir string // holds 10-overlay.conflist only
}

// newHost writes the host's conflist from deploy/cni/10-overlay.conflist,
// as shipped (its cniVersion is what the runtime's libcni picks).
func newHost(t *testing.T, n *lab.Node, shipped []byte) *host {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal(shipped, &list); err != nil {
		t.Fatalf("deploy/cni/10-overlay.conflist: %v", err)
	}
	for _, p := range list["plugins"].([]any) {
		m := p.(map[string]any)
		if m["type"] == "overlay-cni" {
			m["subnetFile"] = n.SubnetFile
			m["dataDir"] = filepath.Join(n.Dir, "cni-cache")
			m["ipam"] = map[string]any{"dataDir": filepath.Join(n.Dir, "ipam")}
		}
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	h := &host{Node: n, netDir: filepath.Join(n.Dir, "net.d")}
	if err := os.MkdirAll(h.netDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.netDir, "10-overlay.conflist"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return h
}

// command runs name args in the host's network namespace (the process is
// forked from a thread switched into it, and only its network namespace
// differs from ours: `ip netns exec` would also remount /sys, which runc
// does not survive) and returns its standard output.
func (h *host) command(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := lab.Do(h.NS, cmd.Start); err != nil {
		return "", fmt.Errorf("start %s on %s: %w", name, h.Name, err)
	}
	if err := cmd.Wait(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s on %s: %w: %s", name, strings.Join(args, " "), h.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// leftovers lists what an attachment leaves on the host when it is not
// deleted: overlay-cni cache entries, host-local reservations and veths on
// cni0. pods are the lab pods' container IDs, whose entries are expected.
func (h *host) leftovers(t *testing.T, pods []string) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir(filepath.Join(h.Dir, "cni-cache"))
	for _, e := range entries {
		if !slices.ContainsFunc(pods, func(id string) bool { return strings.Contains(e.Name(), id) }) {
			out = append(out, "cache entry "+e.Name())
		}
	}
	res, _ := os.ReadDir(filepath.Join(h.Dir, "ipam", "overlay"))
	for _, e := range res {
		if e.Name() == "lock" || strings.HasPrefix(e.Name(), "last_reserved_ip") {
			continue
		}
		data, _ := os.ReadFile(filepath.Join(h.Dir, "ipam", "overlay", e.Name()))
		owner := strings.Fields(string(data))
		if len(owner) == 0 || !slices.Contains(pods, owner[0]) {
			out = append(out, fmt.Sprintf("reservation %s (%s)", e.Name(), strings.Join(owner, " ")))
		}
	}
	hh, err := netlink.NewHandleAt(h.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	links, err := hh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	br, _ := hh.LinkByName("cni0")
	var veths int
	for _, l := range links {
		if br != nil && l.Attrs().MasterIndex == br.Attrs().Index {
			veths++
		}
	}
	if veths != len(pods) {
		out = append(out, fmt.Sprintf("%d veths on cni0, want %d (the lab's pods)", veths, len(pods)))
	}
	sort.Strings(out)
	return out
}

// cachedVersion is the cniVersion of the configuration overlay-cni cached
// for the container's eth0: the version the runtime's libcni sent.
func (h *host) cachedVersion(t *testing.T, containerID string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.Dir, "cni-cache", "overlay-"+containerID+"-eth0"))
	if err != nil {
		t.Fatalf("overlay-cni's cache entry of %s on %s: %v", containerID, h.Name, err)
	}
	var e struct {
		Config struct {
			CNIVersion string `json:"cniVersion"`
		} `json:"config"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("overlay-cni's cache entry of %s: %v", containerID, err)
	}
	return e.Config.CNIVersion
}

// runtimeNetns lists the named network namespaces the runtimes create
// (podman's netns-*, containerd's cni-*).
func runtimeNetns() []string {
	var out []string
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "netns-") || strings.HasPrefix(e.Name(), "cni-") {
				out = append(out, e.Name())
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
