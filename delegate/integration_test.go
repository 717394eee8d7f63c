package delegate_test

// Integration tests: the real overlay-cni binary (bin/overlay-cni, built by
// `go build -o bin/overlay-cni ./cmd/overlay-cni` or `make build`) with the
// real bridge, host-local, loopback and portmap plugins (`make plugins`),
// driven through libcni the way container runtimes drive it.
//
// Nothing touches the root network namespace: every test creates a "host"
// namespace and runs libcni inside it (ns.Do locks the OS thread, and the
// plugin processes inherit that thread's namespace), so cni0 and the host
// ends of the veths live there; every pod gets a namespace of its own. All
// files (subnet.env, overlay-cni's cache, host-local's reservations,
// libcni's cache) live in t.TempDir().

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/delegate"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

const (
	testNetwork = "10.244.0.0/16"
	testLease   = "10.244.7.0/24"
	testGateway = "10.244.7.1"
	testMTU     = 1400 // not the veth default (1500), so the test sees it was applied
)

// lab is one simulated host.
type lab struct {
	t          *testing.T
	hostNS     ns.NetNS
	binDir     string // overlay-cni (and test plugins); CNI_PATH is binDir:bin/cni
	subnetFile string
	dataDir    string // overlay-cni's cache
	ipamDir    string // host-local's dataDir
	cni        *libcni.CNIConfig
}

func newLab(t *testing.T) *lab {
	t.Helper()
	testenv.RequireRoot(t)
	plugins := testenv.PluginDir(t)
	overlayCNI := overlayCNIBinary(t)
	dir := t.TempDir()
	l := &lab{
		t:          t,
		binDir:     filepath.Join(dir, "bin"),
		subnetFile: filepath.Join(dir, "run", "subnet.env"),
		dataDir:    filepath.Join(dir, "cache"),
		ipamDir:    filepath.Join(dir, "ipam"),
	}
	if err := os.MkdirAll(l.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(overlayCNI, filepath.Join(l.binDir, "overlay-cni")); err != nil {
		t.Fatal(err)
	}
	l.cni = libcni.NewCNIConfigWithCacheDir([]string{l.binDir, plugins}, filepath.Join(dir, "libcni"), newExec())
	l.hostNS = testenv.NewNS(t)
	l.writeEnv()
	return l
}

// overlayCNIBinary returns bin/overlay-cni, failing t if it is older than
// any source file it is built from: the tests must not pass against a
// binary that predates the code under review.
func overlayCNIBinary(t testing.TB) string {
	t.Helper()
	bin := testenv.Binary(t, "overlay-cni")
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	root := testenv.RepoRoot(t)
	for _, dir := range []string{"cmd/overlay-cni", "delegate", "subnet", "internal/atomicfile"} {
		srcs, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		for _, src := range srcs {
			if strings.HasSuffix(src, "_test.go") {
				continue
			}
			if sfi, err := os.Stat(src); err == nil && sfi.ModTime().After(fi.ModTime()) {
				t.Fatalf("%s is older than %s: rebuild it (go build -o bin/overlay-cni ./cmd/overlay-cni)", bin, src)
			}
		}
	}
	return bin
}

// newExec is libcni's default exec, made up front: libcni creates its own
// lazily, which races when one CNIConfig serves concurrent requests.
func newExec() invoke.Exec {
	return testenv.CNIExec(os.Stderr)
}

func (l *lab) writeEnv() { l.writeLease(testLease) }

func (l *lab) writeLease(lease string) {
	l.t.Helper()
	env := subnet.NewEnv(netip.MustParsePrefix(testNetwork), netip.MustParsePrefix(lease), testMTU, true)
	if err := subnet.WriteEnv(l.subnetFile, env); err != nil {
		l.t.Fatal(err)
	}
}

func (l *lab) removeEnv() {
	l.t.Helper()
	if err := os.Remove(l.subnetFile); err != nil {
		l.t.Fatal(err)
	}
}

// conflist is deploy/cni/10-overlay.conflist at the given cniVersion (its
// cniVersions dropped), with the lab's paths and the delegate keys merged
// into its delegate.
func (l *lab) conflist(version string, delegateKeys map[string]any) *libcni.NetworkConfigList {
	l.t.Helper()
	list := l.shippedConflist()
	list["cniVersion"] = version
	delete(list, "cniVersions")
	return l.localize(list, delegateKeys)
}

// shippedConflist is deploy/cni/10-overlay.conflist, decoded.
func (l *lab) shippedConflist() map[string]any {
	l.t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(l.t), "deploy", "cni", "10-overlay.conflist"))
	if err != nil {
		l.t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(data, &list); err != nil {
		l.t.Fatalf("deploy/cni/10-overlay.conflist: %v", err)
	}
	return list
}

// localize points a conflist's overlay-cni at the lab's files, merges the
// delegate keys into its delegate and loads it with libcni.
func (l *lab) localize(list map[string]any, delegateKeys map[string]any) *libcni.NetworkConfigList {
	l.t.Helper()
	overlay := list["plugins"].([]any)[0].(map[string]any)
	overlay["subnetFile"] = l.subnetFile
	overlay["dataDir"] = l.dataDir
	overlay["ipam"] = map[string]any{"dataDir": l.ipamDir}
	for k, v := range delegateKeys {
		overlay["delegate"].(map[string]any)[k] = v
	}
	out, err := json.Marshal(list)
	if err != nil {
		l.t.Fatal(err)
	}
	conf, err := libcni.ConfListFromBytes(out)
	if err != nil {
		l.t.Fatalf("ConfListFromBytes: %v", err)
	}
	return conf
}

// inHost runs f in the host namespace: the plugins it execs run there.
func (l *lab) inHost(f func() error) error {
	return l.hostNS.Do(func(ns.NetNS) error { return f() })
}

func rtOf(cid string, pod ns.NetNS) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: cid, NetNS: pod.Path(), IfName: "eth0"}
}

func (l *lab) add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := l.inHost(func() (err error) {
		res, err = l.cni.AddNetworkList(context.Background(), list, rt)
		return err
	})
	return res, err
}

func (l *lab) mustAdd(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *types100.Result {
	l.t.Helper()
	res, err := l.add(list, rt)
	if err != nil {
		l.t.Fatalf("ADD %s: %v", rt.ContainerID, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		l.t.Fatalf("ADD %s result: %v", rt.ContainerID, err)
	}
	return r
}

func (l *lab) del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return l.inHost(func() error { return l.cni.DelNetworkList(context.Background(), list, rt) })
}

func (l *lab) mustDel(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	l.t.Helper()
	if err := l.del(list, rt); err != nil {
		l.t.Fatalf("DEL %s: %v", rt.ContainerID, err)
	}
}

// reservations returns host-local's reservations of network overlay:
// address -> "cid/ifname".
func (l *lab) reservations() map[string]string {
	l.t.Helper()
	return l.reservationsOf("overlay")
}

// reservationsOf returns host-local's reservations of a network.
func (l *lab) reservationsOf(network string) map[string]string {
	l.t.Helper()
	dir := filepath.Join(l.ipamDir, network)
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}
	}
	if err != nil {
		l.t.Fatal(err)
	}
	out := map[string]string{}
	for _, de := range des {
		if _, err := netip.ParseAddr(de.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			l.t.Fatal(err)
		}
		out[de.Name()] = strings.ReplaceAll(strings.TrimSpace(string(data)), "\r\n", "/")
	}
	return out
}

func (l *lab) cacheFile(cid string) string { return filepath.Join(l.dataDir, "overlay-"+cid+"-eth0") }

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func codeOf(t *testing.T, err error) uint {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) carries no CNI error", err, err)
	}
	return te.Code
}

// podAddr returns the IPv4 address of the pod's eth0.
func podAddr(t *testing.T, res *types100.Result) netip.Addr {
	t.Helper()
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok && ip.Address.IP.To4() != nil {
			return a
		}
	}
	t.Fatalf("result has no IPv4 address: %v", res)
	return netip.Addr{}
}

// podView is what a pod's namespace holds for eth0.
type podView struct {
	exists bool
	mtu    int
	addrs  []string
	routes []string
}

func inspectPod(t *testing.T, pod ns.NetNS) podView {
	t.Helper()
	var v podView
	err := pod.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		if err != nil {
			return err
		}
		v.exists = true
		v.mtu = link.Attrs().MTU
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			v.addrs = append(v.addrs, a.IPNet.String())
		}
		routes, err := netlink.RouteList(link, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Gw != nil && r.Dst != nil {
				v.routes = append(v.routes, r.Dst.String()+" via "+r.Gw.String())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("inspect pod namespace: %v", err)
	}
	return v
}

func TestIntegrationAddCheckDel(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	// What CRI-O does with a new conflist: every plugin answers VERSION with
	// the list's version.
	caps, err := l.cni.ValidateNetworkList(context.Background(), list)
	if err != nil || !slices.Equal(caps, []string{"portMappings"}) {
		t.Fatalf("ValidateNetworkList = %v, %v; want [portMappings]", caps, err)
	}
	pod1, pod2 := testenv.NewNS(t), testenv.NewNS(t)
	rt1, rt2 := rtOf("pod1", pod1), rtOf("pod2", pod2)
	// As a runtime does, bring up the pods' lo with the loopback plugin.
	lo, err := libcni.ConfFromBytes([]byte(`{"cniVersion":"1.1.0","name":"cni-loopback","type":"loopback"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range []*libcni.RuntimeConf{rt1, rt2} {
		loRT := *rt
		loRT.IfName = "lo"
		if err := l.inHost(func() error { _, err := l.cni.AddNetwork(context.Background(), lo, &loRT); return err }); err != nil {
			t.Fatalf("loopback ADD: %v", err)
		}
	}
	res1 := l.mustAdd(list, rt1)
	res2 := l.mustAdd(list, rt2)
	addr1, addr2 := podAddr(t, res1), podAddr(t, res2)
	lease := netip.MustParsePrefix(testLease)

	t.Run("pod gets an address in the lease, the cluster route and the lease MTU", func(t *testing.T) {
		if !lease.Contains(addr1) || addr1 == netip.MustParseAddr(testGateway) {
			t.Errorf("pod address %s is not a pod address of %s", addr1, testLease)
		}
		v := inspectPod(t, pod1)
		if !v.exists || v.mtu != testMTU {
			t.Errorf("pod eth0 exists=%v mtu=%d, want MTU %d", v.exists, v.mtu, testMTU)
		}
		if !slices.Contains(v.addrs, addr1.String()+"/24") {
			t.Errorf("pod eth0 addresses %v, want %s/24", v.addrs, addr1)
		}
		if want := testNetwork + " via " + testGateway; !slices.Contains(v.routes, want) {
			t.Errorf("pod routes %v lack %q", v.routes, want)
		}
		if got := l.reservations()[addr1.String()]; got != "pod1/eth0" {
			t.Errorf("host-local reservation of %s = %q, want pod1/eth0", addr1, got)
		}
	})

	t.Run("bridge holds the gateway in the host namespace", func(t *testing.T) {
		err := l.inHost(func() error {
			br, err := netlink.LinkByName("cni0")
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.IPNet.String() == testGateway+"/24" {
					return nil
				}
			}
			return fmt.Errorf("cni0 addresses %v lack %s/24", addrs, testGateway)
		})
		if err != nil {
			t.Error(err)
		}
	})

	t.Run("cache entry holds the rendered config with modes 0700/0600", func(t *testing.T) {
		fi, err := os.Stat(l.dataDir)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("cache dir: %v %v, want mode 0700", fi, err)
		}
		fi, err = os.Stat(l.cacheFile("pod1"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("cache file: %v %v, want mode 0600", fi, err)
		}
		data, _ := os.ReadFile(l.cacheFile("pod1"))
		var entry struct {
			ContainerID string `json:"containerID"`
			Config      struct {
				Type string `json:"type"`
				MTU  int    `json:"mtu"`
				IPAM struct {
					Ranges [][]map[string]string `json:"ranges"`
				} `json:"ipam"`
			} `json:"config"`
		}
		if err := json.Unmarshal(data, &entry); err != nil {
			t.Fatal(err)
		}
		if entry.ContainerID != "pod1" || entry.Config.Type != "bridge" || entry.Config.MTU != testMTU ||
			len(entry.Config.IPAM.Ranges) != 1 || entry.Config.IPAM.Ranges[0][0]["subnet"] != testLease {
			t.Errorf("cache entry %s", data)
		}
	})

	t.Run("pods reach each other across the bridge", func(t *testing.T) {
		if err := tcpReach(t, pod1, pod2, addr2); err != nil {
			t.Error(err)
		}
	})

	t.Run("CHECK passes", func(t *testing.T) {
		if err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, rt1) }); err != nil {
			t.Errorf("CHECK: %v", err)
		}
	})

	t.Run("DEL removes the interface and frees the address, twice", func(t *testing.T) {
		l.mustDel(list, rt1)
		if v := inspectPod(t, pod1); v.exists {
			t.Error("pod1 eth0 still exists after DEL")
		}
		if got, ok := l.reservations()[addr1.String()]; ok {
			t.Errorf("address %s still reserved (%s) after DEL", addr1, got)
		}
		if exists(l.cacheFile("pod1")) {
			t.Error("cache entry left after DEL")
		}
		l.mustDel(list, rt1)
	})

	t.Run("DEL with an empty netns still frees the address", func(t *testing.T) {
		l.mustDel(list, &libcni.RuntimeConf{ContainerID: "pod2", IfName: "eth0"})
		if got, ok := l.reservations()[addr2.String()]; ok {
			t.Errorf("address %s still reserved (%s) after DEL", addr2, got)
		}
		if exists(l.cacheFile("pod2")) {
			t.Error("cache entry left after DEL")
		}
	})
}

// tcpReach connects from pod "from" to a listener in pod "to" at addr.
func tcpReach(t *testing.T, from, to ns.NetNS, addr netip.Addr) error {
	t.Helper()
	var ln net.Listener
	if err := to.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
		return err
	}); err != nil {
		return fmt.Errorf("listen in pod: %w", err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = c.Write([]byte("hi"))
			c.Close()
		}
		accepted <- err
	}()
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		return err
	})
	if err != nil {
		return fmt.Errorf("connect from pod to %s: %w", ln.Addr(), err)
	}
	select {
	case err := <-accepted:
		return err
	case <-time.After(testenv.Deadline(testenv.Slack)):
		return errors.New("listener never accepted")
	}
}

func TestIntegrationDelWithoutCache(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	pod := testenv.NewNS(t)
	rt := rtOf("pod1", pod)
	addr := podAddr(t, l.mustAdd(list, rt))
	if err := os.Remove(l.cacheFile("pod1")); err != nil {
		t.Fatal(err)
	}
	l.mustDel(list, rt)
	if v := inspectPod(t, pod); v.exists {
		t.Error("eth0 still exists after DEL without cache")
	}
	if _, ok := l.reservations()[addr.String()]; ok {
		t.Errorf("address %s still reserved after DEL without cache", addr)
	}
}

func TestIntegrationDelWithoutCacheOrSubnetEnvSucceeds(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	l.removeEnv()
	l.mustDel(list, rtOf("never-added", testenv.NewNS(t)))
}

func TestIntegrationDelWithDaemonDown(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	rt := rtOf("pod1", testenv.NewNS(t))
	addr := podAddr(t, l.mustAdd(list, rt))
	l.removeEnv() // overlayd gone
	l.mustDel(list, rt)
	if _, ok := l.reservations()[addr.String()]; ok {
		t.Errorf("address %s still reserved after DEL with the daemon down", addr)
	}
}

func TestIntegrationCorruptCache(t *testing.T) {
	for name, content := range map[string][]byte{
		"truncated": []byte(`{"format":1,"network":"overlay","contai`),
		"empty":     {},
		"garbage":   []byte("\x00\x01not json"),
	} {
		t.Run(name, func(t *testing.T) {
			l := newLab(t)
			list := l.conflist("1.1.0", nil)
			rt := rtOf("pod1", testenv.NewNS(t))
			addr := podAddr(t, l.mustAdd(list, rt))
			if err := os.WriteFile(l.cacheFile("pod1"), content, 0o600); err != nil {
				t.Fatal(err)
			}
			// CHECK reports the corrupt entry clearly.
			err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, rt) })
			if code := codeOf(t, err); code != delegate.CodeCacheCorrupt {
				t.Errorf("CHECK with a corrupt cache: code %d (%v), want %d", code, err, delegate.CodeCacheCorrupt)
			}
			// DEL falls back to subnet.env and still frees the address.
			l.mustDel(list, rt)
			if _, ok := l.reservations()[addr.String()]; ok {
				t.Errorf("address %s still reserved after DEL with a corrupt cache", addr)
			}
			if exists(l.cacheFile("pod1")) {
				t.Error("corrupt cache entry left after a successful DEL")
			}
		})
	}
}

// buildTestPlugin builds the test plugin testdata/<name> into the lab's
// plugin directory.
func (l *lab) buildTestPlugin(name string) {
	l.t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(l.binDir, name), "./testdata/"+name)
	cmd.Env = testenv.ProgramEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		l.t.Fatalf("build testdata/%s: %v\n%s", name, err, out)
	}
}

// TestIntegrationDelegateDelFault: the delegate's DEL really fails (the
// faultybridge plugin answers DEL with a CNI error while a fault file
// exists). The DEL fails, the cache entry and the address stay; once the
// fault is cleared, a retried DEL frees the address and the cache entry.
func TestIntegrationDelegateDelFault(t *testing.T) {
	l := newLab(t)
	l.buildTestPlugin("faultybridge")
	fault := filepath.Join(t.TempDir(), "fail-del")
	list := l.conflist("1.1.0", map[string]any{"type": "faultybridge", "faultFile": fault})
	pod := testenv.NewNS(t)
	rt := rtOf("pod1", pod)
	addr := podAddr(t, l.mustAdd(list, rt))

	if err := os.WriteFile(fault, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := l.del(list, rt)
	if err == nil {
		t.Fatal("DEL succeeded although the delegate's DEL failed")
	}
	if code := codeOf(t, err); code != 5 || !strings.Contains(err.Error(), "injected DEL failure") {
		t.Errorf("DEL error = %v (code %d), want the delegate's code 5 error", err, code)
	}
	if !exists(l.cacheFile("pod1")) {
		t.Fatal("cache entry removed although the delegate's DEL failed")
	}
	if got := l.reservations()[addr.String()]; got != "pod1/eth0" {
		t.Fatalf("reservation of %s = %q after the failed DEL, want it kept", addr, got)
	}

	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	l.mustDel(list, rt)
	if _, ok := l.reservations()[addr.String()]; ok {
		t.Errorf("address %s still reserved after the retried DEL", addr)
	}
	if exists(l.cacheFile("pod1")) {
		t.Error("cache entry left after the retried DEL")
	}
	if v := inspectPod(t, pod); v.exists {
		t.Error("eth0 still exists after the retried DEL")
	}
}

// TestIntegrationAddFailureRollsBack: with a /30 lease host-local has one
// pod address; the second ADD fails inside the delegate, and overlay-cni's
// rollback leaves no interface, reservation or cache entry behind.
func TestIntegrationAddFailureRollsBack(t *testing.T) {
	l := newLab(t)
	l.writeLease("10.244.7.0/30")
	list := l.conflist("1.1.0", nil)
	first := podAddr(t, l.mustAdd(list, rtOf("pod1", testenv.NewNS(t))))
	pod2 := testenv.NewNS(t)
	_, err := l.add(list, rtOf("pod2", pod2))
	if err == nil {
		t.Fatal("second ADD in a /30 succeeded")
	}
	t.Logf("ADD error: %v", err)
	if diff := cmp.Diff(map[string]string{first.String(): "pod1/eth0"}, l.reservations()); diff != "" {
		t.Errorf("reservations after the failed ADD (-want +got):\n%s", diff)
	}
	if exists(l.cacheFile("pod2")) {
		t.Error("cache entry left after a failed and rolled back ADD")
	}
	if v := inspectPod(t, pod2); v.exists {
		t.Error("eth0 left in the pod after a failed ADD")
	}
}

// TestIntegrationRepeatedAddKeepsPod: a second ADD of the same container
// and interface fails (as bridge alone does) and leaves the pod as it was:
// its eth0 and address, its host-local reservation and its cache entry
// (regression: the rollback of the failed ADD deleted all three). A DEL
// then frees everything.
func TestIntegrationRepeatedAddKeepsPod(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	pod := testenv.NewNS(t)
	rt := rtOf("pod1", pod)
	addr := podAddr(t, l.mustAdd(list, rt))
	before := inspectPod(t, pod)
	entry, err := os.ReadFile(l.cacheFile("pod1"))
	if err != nil {
		t.Fatal(err)
	}

	_, err = l.add(list, rt)
	if code := codeOf(t, err); code != delegate.CodeAlreadyAttached {
		t.Fatalf("second ADD = %v (code %d), want code %d", err, code, delegate.CodeAlreadyAttached)
	}
	if diff := cmp.Diff(before, inspectPod(t, pod), cmp.AllowUnexported(podView{})); diff != "" {
		t.Errorf("pod changed by the failed ADD (-before +after):\n%s", diff)
	}
	if got := l.reservations()[addr.String()]; got != "pod1/eth0" {
		t.Errorf("reservation of %s = %q after the failed ADD, want pod1/eth0", addr, got)
	}
	if after, err := os.ReadFile(l.cacheFile("pod1")); err != nil || string(after) != string(entry) {
		t.Errorf("cache entry changed by the failed ADD: %v", err)
	}
	if err := tcpReach(t, l.hostNS, pod, addr); err != nil {
		t.Errorf("pod unreachable after the failed ADD: %v", err)
	}

	// Without a cache entry, the interface in the namespace alone is
	// enough to refuse.
	if err := os.Rename(l.cacheFile("pod1"), l.cacheFile("pod1")+".moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.add(list, rt); codeOf(t, err) != delegate.CodeAlreadyAttached {
		t.Errorf("ADD with eth0 in the pod = %v, want code %d", err, delegate.CodeAlreadyAttached)
	}
	if err := os.Rename(l.cacheFile("pod1")+".moved", l.cacheFile("pod1")); err != nil {
		t.Fatal(err)
	}

	l.mustDel(list, rt)
	if v := inspectPod(t, pod); v.exists {
		t.Error("eth0 left after DEL")
	}
	if len(l.reservations()) != 0 || exists(l.cacheFile("pod1")) {
		t.Errorf("DEL left reservations %v or the cache entry", l.reservations())
	}
}

// TestIntegrationLeaseChange: after the host's lease changes, a new pod
// gets an address in the new lease and a working gateway with no manual
// step (regression: bridge refused every ADD because cni0 still held the
// old lease's gateway). The pod of the old lease is told to be recreated
// by CHECK (101), and its DEL still releases its address.
func TestIntegrationLeaseChange(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	old := testenv.NewNS(t)
	oldRT := rtOf("old", old)
	oldRes := l.mustAdd(list, oldRT)
	oldAddr := podAddr(t, oldRes)

	const newLease = "10.244.9.0/24"
	l.writeLease(newLease)
	pod := testenv.NewNS(t)
	addr := podAddr(t, l.mustAdd(list, rtOf("new", pod)))
	if !netip.MustParsePrefix(newLease).Contains(addr) {
		t.Fatalf("new pod got %s, want an address in %s", addr, newLease)
	}
	if got := l.bridgeAddrs(); !slices.Equal(got, []string{"10.244.9.1/24"}) {
		t.Errorf("cni0 holds %v, want only the new gateway 10.244.9.1/24", got)
	}
	if err := tcpReach(t, l.hostNS, pod, addr); err != nil {
		t.Errorf("new pod unreachable from its host: %v", err)
	}

	err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, oldRT) })
	if code := codeOf(t, err); code != delegate.CodeLeaseChanged {
		t.Errorf("CHECK of the old pod = %v, want code %d", err, delegate.CodeLeaseChanged)
	}
	l.mustDel(list, oldRT)
	if _, ok := l.reservations()[oldAddr.String()]; ok {
		t.Errorf("old pod's address %s still reserved after its DEL", oldAddr)
	}
	if err := tcpReach(t, l.hostNS, pod, addr); err != nil {
		t.Errorf("new pod unreachable after the old pod's DEL: %v", err)
	}
}

// bridgeAddrs lists cni0's IPv4 addresses in the host namespace.
func (l *lab) bridgeAddrs() []string {
	l.t.Helper()
	var out []string
	err := l.inHost(func() error {
		br, err := netlink.LinkByName(delegate.DefaultBridge)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
		for _, a := range addrs {
			out = append(out, a.IPNet.String())
		}
		return err
	})
	if err != nil {
		l.t.Fatalf("list the addresses of %s: %v", delegate.DefaultBridge, err)
	}
	return out
}

func TestIntegrationWithoutSubnetEnv(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	l.removeEnv()

	_, err := l.add(list, rtOf("pod1", testenv.NewNS(t)))
	if code := codeOf(t, err); code != types.ErrTryAgainLater || !strings.Contains(err.Error(), l.subnetFile) {
		t.Errorf("ADD without subnet.env = %v (code %d), want code 11 naming %s", err, code, l.subnetFile)
	}
	if len(l.reservations()) != 0 || exists(l.cacheFile("pod1")) {
		t.Error("ADD without subnet.env reserved an address or wrote a cache entry")
	}

	status := func() error {
		return l.inHost(func() error { return l.cni.GetStatusNetworkList(context.Background(), list) })
	}
	daemon := l.fakeReadyz()
	err = status()
	if code := codeOf(t, err); code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS without subnet.env = %v (code %d), want 50", err, code)
	}
	l.writeEnv()
	if err := status(); err != nil {
		t.Errorf("STATUS with subnet.env and overlayd ready: %v", err)
	}
	daemon.ready.Store(false)
	if err := status(); codeOf(t, err) != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), delegate.DefaultHealthAddr) {
		t.Errorf("STATUS with overlayd not ready = %v, want 50 naming %s", err, delegate.DefaultHealthAddr)
	}
}

// TestIntegrationStatusDaemonStopped: with subnet.env in place but no
// overlayd answering on its health address, STATUS is 50 (an ADD would
// work, but its pod would reach no new peer): what cni.md promises.
func TestIntegrationStatusDaemonStopped(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	err := l.inHost(func() error { return l.cni.GetStatusNetworkList(context.Background(), list) })
	if code := codeOf(t, err); code != types.ErrPluginNotAvailable || !strings.Contains(err.Error(), "overlayd") {
		t.Errorf("STATUS with overlayd stopped = %v (code %d), want 50 naming overlayd", err, code)
	}
}

// readyzServer stands for overlayd's health endpoint in the host namespace.
type readyzServer struct{ ready atomic.Bool }

// fakeReadyz serves /readyz on the default health address inside the host
// namespace (its loopback is brought up), ready until told otherwise.
func (l *lab) fakeReadyz() *readyzServer {
	l.t.Helper()
	rs := &readyzServer{}
	rs.ready.Store(true)
	var ln net.Listener
	err := l.inHost(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", delegate.DefaultHealthAddr)
		return err
	})
	if err != nil {
		l.t.Fatalf("listen on %s in the host namespace: %v", delegate.DefaultHealthAddr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !rs.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:\nlease: expired")
			return
		}
		fmt.Fprintln(w, "ready")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	l.t.Cleanup(func() { _ = srv.Close() })
	return rs
}

// TestIntegrationGC: the runtime lost its own cache (a fresh libcni cache
// directory), so only overlay-cni's GC can clean up. Attachments not in the
// valid list lose their address and cache entry, including one whose cache
// entry is gone (host-local's sweep); the valid one keeps both.
func TestIntegrationGC(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	addrs := map[string]netip.Addr{}
	for _, cid := range []string{"keep", "stale1", "stale2", "nocache"} {
		addrs[cid] = podAddr(t, l.mustAdd(list, rtOf(cid, testenv.NewNS(t))))
	}
	if err := os.Remove(l.cacheFile("nocache")); err != nil {
		t.Fatal(err)
	}

	runtime := libcni.NewCNIConfigWithCacheDir(l.cni.Path, t.TempDir(), newExec())
	err := l.inHost(func() error {
		return runtime.GCNetworkList(context.Background(), list, &libcni.GCArgs{
			ValidAttachments: []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}},
		})
	})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	want := map[string]string{addrs["keep"].String(): "keep/eth0"}
	if diff := cmp.Diff(want, l.reservations()); diff != "" {
		t.Errorf("host-local reservations after GC (-want +got):\n%s", diff)
	}
	for _, cid := range []string{"stale1", "stale2"} {
		if exists(l.cacheFile(cid)) {
			t.Errorf("cache entry of %s left after GC", cid)
		}
	}
	if !exists(l.cacheFile("keep")) {
		t.Error("cache entry of the valid attachment removed by GC")
	}
	for _, f := range []string{"lock", "last_reserved_ip.0"} {
		if !exists(filepath.Join(l.ipamDir, "overlay", f)) {
			t.Errorf("GC removed host-local's %s", f)
		}
	}
}

// TestIntegrationConcurrentAdds: 20 pods added at once all get distinct
// addresses in the lease; deleting them at once frees them all.
func TestIntegrationConcurrentAdds(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	const n = 20
	pods := make([]ns.NetNS, n)
	for i := range pods {
		pods[i] = testenv.NewNS(t)
	}
	addrs := make([]netip.Addr, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.add(list, rtOf(fmt.Sprintf("pod%02d", i), pods[i]))
			if err != nil {
				errs[i] = err
				return
			}
			r, err := types100.NewResultFromResult(res)
			if err != nil || len(r.IPs) == 0 {
				errs[i] = fmt.Errorf("result %v: %v", res, err)
				return
			}
			addrs[i], _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		}()
	}
	wg.Wait()
	lease := netip.MustParsePrefix(testLease)
	seen := map[netip.Addr]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD pod%02d: %v", i, err)
			continue
		}
		if !lease.Contains(addrs[i]) {
			t.Errorf("pod%02d got %s, outside %s", i, addrs[i], lease)
		}
		if j, dup := seen[addrs[i]]; dup {
			t.Errorf("pod%02d and pod%02d both got %s", j, i, addrs[i])
		}
		seen[addrs[i]] = i
	}
	if got := len(l.reservations()); got != n {
		t.Errorf("%d reservations after %d ADDs", got, n)
	}

	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.del(list, rtOf(fmt.Sprintf("pod%02d", i), pods[i]))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL pod%02d: %v", i, err)
		}
	}
	if r := l.reservations(); len(r) != 0 {
		t.Errorf("reservations left after all DELs: %v", r)
	}
}

// TestIntegrationVersions: every supported cniVersion gets a result in that
// version, CHECK works where the version has it, and DEL frees the address.
func TestIntegrationVersions(t *testing.T) {
	l := newLab(t)
	for i, ver := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			list := l.conflist(ver, nil)
			pod := testenv.NewNS(t)
			rt := rtOf(fmt.Sprintf("v%d", i), pod)
			res, err := l.add(list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != ver {
				t.Errorf("result version %s, want %s", res.Version(), ver)
			}
			r, err := types100.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			addr := podAddr(t, r)
			if !netip.MustParsePrefix(testLease).Contains(addr) {
				t.Errorf("address %s outside the lease", addr)
			}
			var sandboxed bool
			for _, ifc := range r.Interfaces {
				sandboxed = sandboxed || (ifc.Name == "eth0" && ifc.Sandbox == pod.Path())
			}
			if !sandboxed {
				t.Errorf("result interfaces %v lack eth0 in %s", r.Interfaces, pod.Path())
			}
			if ver != "0.3.0" && ver != "0.3.1" {
				if err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, rt) }); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			l.mustDel(list, rt)
			if _, ok := l.reservations()[addr.String()]; ok {
				t.Errorf("address %s still reserved after DEL", addr)
			}
		})
	}
}

// libcniBefore12Newest is the newest spec version libcni knows before
// v1.2.0 — the library of containerd 1.6 and 1.7, podman 4 and the CRI-O
// releases built with it. Such a runtime refuses a newer cniVersion
// ("unsupported CNI result version") and ignores cniVersions.
const libcniBefore12Newest = "1.0.0"

// TestIntegrationShippedConflist: deploy/cni/10-overlay.conflist loads in
// the runtimes in wide use. As a runtime with libcni before v1.2 reads it
// (cniVersions ignored), its cniVersion is one that library knows, and
// ADD, CHECK and DEL work at it through libcni; as a runtime with a newer
// libcni reads it, cniVersions gives 1.1.0, and STATUS and GC work.
// (test/runtime drives the real containerd 1.6 and podman 4 with it.)
func TestIntegrationShippedConflist(t *testing.T) {
	l := newLab(t)
	l.fakeReadyz()

	old := l.shippedConflist()
	delete(old, "cniVersions")
	oldList := l.localize(old, nil)
	if gt, err := version.GreaterThan(oldList.CNIVersion, libcniBefore12Newest); err != nil || gt {
		t.Fatalf("shipped cniVersion %q: a runtime with libcni before v1.2 knows at most %s (%v)", oldList.CNIVersion, libcniBefore12Newest, err)
	}
	pod := testenv.NewNS(t)
	rt := rtOf("old-runtime", pod)
	res, err := l.add(oldList, rt)
	if err != nil {
		t.Fatalf("ADD at %s: %v", oldList.CNIVersion, err)
	}
	if res.Version() != oldList.CNIVersion {
		t.Errorf("result version %s, want %s", res.Version(), oldList.CNIVersion)
	}
	if err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), oldList, rt) }); err != nil {
		t.Errorf("CHECK at %s: %v", oldList.CNIVersion, err)
	}
	l.mustDel(oldList, rt)

	newList := l.localize(l.shippedConflist(), nil)
	if newList.CNIVersion != "1.1.0" {
		t.Fatalf("current libcni loads the shipped conflist at %s, want 1.1.0 (from cniVersions)", newList.CNIVersion)
	}
	if err := l.inHost(func() error { return l.cni.GetStatusNetworkList(context.Background(), newList) }); err != nil {
		t.Errorf("STATUS at 1.1.0: %v", err)
	}
	rt = rtOf("new-runtime", pod)
	l.mustAdd(newList, rt)
	err = l.inHost(func() error {
		return l.cni.GCNetworkList(context.Background(), newList,
			&libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "other", IfName: "eth0"}}})
	})
	if err != nil {
		t.Errorf("GC at 1.1.0: %v", err)
	}
	if len(l.reservations()) != 0 || exists(l.cacheFile("new-runtime")) {
		t.Errorf("GC (new-runtime not valid) left reservations %v or the cache entry", l.reservations())
	}
}

// TestIntegrationRejectsBadIDs execs overlay-cni directly (libcni refuses
// such IDs before it execs anything) and expects a CNI error, code 4, with
// nothing reserved.
func TestIntegrationRejectsBadIDs(t *testing.T) {
	l := newLab(t)
	pod := testenv.NewNS(t)
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q}}`,
		l.subnetFile, l.dataDir, l.ipamDir)
	bin := filepath.Join(l.binDir, "overlay-cni")
	for _, tc := range []struct{ cid, ifname string }{
		{"a/b", "eth0"}, {"..", "eth0"}, {"../../etc", "eth0"}, {"a..b", "eth0"},
		{"c1", "eth/0"}, {"c1", ".."}, {"c1", "x..y"},
	} {
		for _, verb := range []string{"ADD", "DEL"} {
			t.Run(fmt.Sprintf("%s %q %q", verb, tc.cid, tc.ifname), func(t *testing.T) {
				args := &invoke.Args{Command: verb, ContainerID: tc.cid, NetNS: pod.Path(), IfName: tc.ifname,
					Path: strings.Join(l.cni.Path, ":")}
				err := l.inHost(func() error {
					_, err := invoke.ExecPluginWithResult(context.Background(), bin, []byte(conf), args, newExec())
					return err
				})
				if code := codeOf(t, err); code != types.ErrInvalidEnvironmentVariables {
					t.Errorf("code %d (%v), want 4", code, err)
				}
			})
		}
	}
	if r := l.reservations(); len(r) != 0 {
		t.Errorf("reservations after rejected requests: %v", r)
	}
	if names, _ := os.ReadDir(l.dataDir); len(names) != 0 {
		t.Errorf("cache entries after rejected requests: %v", names)
	}
}

// BenchmarkAddDel measures a pod's ADD+DEL through overlay-cni and through
// the bridge plugin directly with the same rendered configuration; the
// difference is overlay-cni's own overhead (exec, subnet.env, render, cache).
func BenchmarkAddDel(b *testing.B) {
	testenv.RequireRoot(b)
	plugins := testenv.PluginDir(b)
	overlayCNI := overlayCNIBinary(b)
	dir := b.TempDir()
	subnetFile := filepath.Join(dir, "subnet.env")
	env := subnet.NewEnv(netip.MustParsePrefix(testNetwork), netip.MustParsePrefix(testLease), testMTU, true)
	if err := subnet.WriteEnv(subnetFile, env); err != nil {
		b.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q}}`,
		subnetFile, filepath.Join(dir, "cache"), filepath.Join(dir, "ipam"))
	nc, err := delegate.ParseConf([]byte(conf))
	if err != nil {
		b.Fatal(err)
	}
	d, err := delegate.Render(nc, env)
	if err != nil {
		b.Fatal(err)
	}
	hostNS, pod := testenv.NewNS(b), testenv.NewNS(b)

	cniPath := strings.Join([]string{filepath.Dir(overlayCNI), plugins}, ":")
	cniExec := newExec()
	for _, tc := range []struct {
		name, plugin string
		conf         []byte
	}{
		{"bridge", filepath.Join(plugins, "bridge"), d.Config},
		{"overlay-cni", overlayCNI, []byte(conf)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			err := hostNS.Do(func(ns.NetNS) error {
				for i := 0; b.Loop(); i++ {
					args := &invoke.Args{ContainerID: fmt.Sprintf("bench%d", i), NetNS: pod.Path(), IfName: "eth0", Path: cniPath}
					args.Command = "ADD"
					if _, err := invoke.ExecPluginWithResult(context.Background(), tc.plugin, tc.conf, args, cniExec); err != nil {
						return err
					}
					args.Command = "DEL"
					if err := invoke.ExecPluginWithoutResult(context.Background(), tc.plugin, tc.conf, args, cniExec); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestIntegrationAddRefusesWhatIsNoNetNS: ADD and CHECK with a CNI_NETNS
// that is no network namespace — a missing path, a regular file, a
// directory, a device, a namespace of another kind — are refused with code
// 4 and a message naming CNI_NETNS, before anything is cached or reserved
// (regressions: bridge failed with code 999 after host-local reserved an
// address, and for a regular file its rollback DEL failed too, leaving the
// cache entry behind). DEL of the same attachments still succeeds, and a
// pod's DEL with its namespace gone still frees its address.
func TestIntegrationAddRefusesWhatIsNoNetNS(t *testing.T) {
	l := newLab(t)
	list := l.conflist("1.1.0", nil)
	dir := t.TempDir()
	file := filepath.Join(dir, "netns-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, netns, want string }{
		{"missing", filepath.Join(dir, "gone"), "no such file"},
		{"regular file", file, "it is a regular file, not a network namespace"},
		{"directory", dir, "it is a directory, not a network namespace"},
		{"device", "/dev/null", "is not a network namespace"},
		{"mount namespace", "/proc/self/ns/mnt", "a namespace of another kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &libcni.RuntimeConf{ContainerID: "bad", NetNS: tc.netns, IfName: "eth0"}
			_, err := l.add(list, rt)
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(te.Msg, "CNI_NETNS") || !strings.Contains(te.Msg, tc.want) {
				t.Fatalf("ADD with CNI_NETNS %s = %v, want code 4 naming CNI_NETNS and %q", tc.netns, err, tc.want)
			}
			if exists(l.cacheFile("bad")) {
				t.Error("a refused ADD left a cache entry")
			}
			if r := l.reservations(); len(r) != 0 {
				t.Errorf("a refused ADD left reservations: %v", r)
			}
			args := &invoke.Args{Command: "CHECK", ContainerID: "bad", NetNS: tc.netns, IfName: "eth0", Path: strings.Join(l.cni.Path, ":")}
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","subnetFile":%q,"dataDir":%q,"prevResult":{"cniVersion":"1.1.0"}}`, l.subnetFile, l.dataDir)
			err = l.inHost(func() error {
				return invoke.ExecPluginWithoutResult(context.Background(), filepath.Join(l.binDir, "overlay-cni"), []byte(conf), args, newExec())
			})
			if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(te.Msg, tc.want) {
				t.Errorf("CHECK with CNI_NETNS %s = %v, want code 4", tc.netns, err)
			}
			if tc.name != "device" { // a device is refused by every verb
				l.mustDel(list, rt)
			}
		})
	}

	t.Run("DEL of a pod whose namespace is gone frees its address", func(t *testing.T) {
		pod := testenv.NewNS(t)
		addr := podAddr(t, l.mustAdd(list, rtOf("pod1", pod)))
		path := filepath.Join(dir, "closed-netns") // as the runtime passes it once the namespace is gone
		l.mustDel(list, &libcni.RuntimeConf{ContainerID: "pod1", NetNS: path, IfName: "eth0"})
		if got, ok := l.reservations()[addr.String()]; ok {
			t.Errorf("address %s still reserved (%s) after DEL", addr, got)
		}
		if exists(l.cacheFile("pod1")) {
			t.Error("cache entry left after DEL")
		}
	})
}
