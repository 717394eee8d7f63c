package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// Unit tests of the verbs' logic with a fake Invoker. They need no root
// and exec nothing; integration_test.go runs the same verbs for real.

type call struct {
	Verb   string
	Plugin string
	Conf   string
	RT     Runtime
}

type fakeInvoker struct {
	mu    sync.Mutex
	calls []call
	// errs fails a verb ("ADD", "DEL", ...) with the error.
	errs map[string]error
	// onAdd runs inside Add, e.g. to look at the cache at that moment.
	onAdd func()
	// readyz are the addresses DaemonReady was asked (not in calls).
	readyz []string
	// exists names the interfaces the container's namespace has.
	exists map[string]bool
	// onExists runs inside InterfaceExists, e.g. to hold concurrent ADDs
	// there until all have passed.
	onExists func()
}

func (f *fakeInvoker) record(verb, plugin string, conf []byte, rt Runtime) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{verb, plugin, string(conf), rt})
	return f.errs[verb]
}

func (f *fakeInvoker) Add(_ context.Context, plugin string, conf []byte, rt Runtime) (types.Result, error) {
	if f.onAdd != nil {
		f.onAdd()
	}
	if err := f.record("ADD", plugin, conf, rt); err != nil {
		return nil, err
	}
	return &types100.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*types100.Interface{{Name: "cni0"}, {Name: rt.IfName, Sandbox: rt.NetNS}},
		IPs: []*types100.IPConfig{{
			Interface: types100.Int(1),
			Address:   net.IPNet{IP: net.IPv4(10, 244, 7, 2), Mask: net.CIDRMask(24, 32)},
			Gateway:   net.IPv4(10, 244, 7, 1),
		}},
	}, nil
}

func (f *fakeInvoker) Del(_ context.Context, plugin string, conf []byte, rt Runtime) error {
	return f.record("DEL", plugin, conf, rt)
}

func (f *fakeInvoker) Check(_ context.Context, plugin string, conf []byte, rt Runtime) error {
	return f.record("CHECK", plugin, conf, rt)
}

func (f *fakeInvoker) Status(_ context.Context, plugin string, conf []byte, rt Runtime) error {
	return f.record("STATUS", plugin, conf, rt)
}

func (f *fakeInvoker) GC(_ context.Context, plugin string, conf []byte, rt Runtime) error {
	return f.record("GC", plugin, conf, rt)
}

// DaemonReady records the address asked and answers errs["READYZ"].
func (f *fakeInvoker) DaemonReady(_ context.Context, addr string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readyz = append(f.readyz, addr)
	return f.errs["READYZ"]
}

// InterfaceExists answers exists[ifname].
func (f *fakeInvoker) InterfaceExists(_, ifname string) (bool, error) {
	if f.onExists != nil {
		f.onExists()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exists[ifname], nil
}

func (f *fakeInvoker) verbs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var v []string
	for _, c := range f.calls {
		v = append(v, c.Verb)
	}
	return v
}

// fixture is one host: a subnet.env, a cache dir and a host-local dir, all
// in a temporary directory.
type fixture struct {
	t          *testing.T
	subnetFile string
	dataDir    string
	ipamDir    string
	inv        *fakeInvoker
	plugin     *Plugin
	stdout     *bytes.Buffer
	stderr     *bytes.Buffer
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	fx := &fixture{
		t:          t,
		subnetFile: filepath.Join(dir, "run", "subnet.env"),
		dataDir:    filepath.Join(dir, "cache"),
		ipamDir:    filepath.Join(dir, "ipam"),
		inv:        &fakeInvoker{errs: map[string]error{}},
		stdout:     &bytes.Buffer{},
		stderr:     &bytes.Buffer{},
	}
	fx.plugin = New(fx.inv, fx.stdout, fx.stderr)
	// The fixture's namespaces are names only: the fake delegate never enters them.
	fx.plugin.netns = acceptStandIns(func(path string) bool { return strings.HasPrefix(path, "/var/run/netns/") })
	fx.writeEnv("10.244.7.0/24")
	return fx
}

// acceptStandIns is a namespace check for unit tests whose fake delegate
// never enters a namespace: it takes the paths isStandIn accepts for
// network namespaces, and judges every other path as overlay-cni does.
func acceptStandIns(isStandIn func(string) bool) func(string) error {
	return func(path string) error {
		if isStandIn(path) {
			return nil
		}
		return networkNamespace(path)
	}
}

func (fx *fixture) writeEnv(lease string) {
	fx.t.Helper()
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix(lease), 1450, true)
	if err := subnet.WriteEnv(fx.subnetFile, env); err != nil {
		fx.t.Fatal(err)
	}
}

func (fx *fixture) removeEnv() {
	fx.t.Helper()
	if err := os.Remove(fx.subnetFile); err != nil {
		fx.t.Fatal(err)
	}
}

// conf is the network configuration with extra top-level JSON members.
func (fx *fixture) conf(version string, extra ...string) []byte {
	members := append([]string{
		fmt.Sprintf(`"cniVersion":%q,"name":"overlay","type":"overlay-cni"`, version),
		fmt.Sprintf(`"subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q}`, fx.subnetFile, fx.dataDir, fx.ipamDir),
	}, extra...)
	return []byte("{" + strings.Join(members, ",") + "}")
}

func (fx *fixture) args(cid, ifname string, conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: cid, Netns: "/var/run/netns/" + cid, IfName: ifname, Path: "/opt/cni/bin", StdinData: conf}
}

func (fx *fixture) cacheFile(cid, ifname string) string {
	return filepath.Join(fx.dataDir, "overlay-"+cid+"-"+ifname)
}

func (fx *fixture) add(cid string) {
	fx.t.Helper()
	if err := fx.plugin.Add(fx.args(cid, "eth0", fx.conf("1.1.0"))); err != nil {
		fx.t.Fatalf("Add(%s): %v", cid, err)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// wantCode fails t unless err is a *types.Error with the code.
func wantCode(t *testing.T, err error, code uint) *types.Error {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *types.Error, want code %d", err, err, code)
	}
	if te.Code != code {
		t.Fatalf("error code %d (%v), want %d", te.Code, te, code)
	}
	return te
}

func TestAddCachesBeforeDelegatingAndAnswersInRequestedVersion(t *testing.T) {
	for _, ver := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			fx := newFixture(t)
			cached := ""
			fx.inv.onAdd = func() {
				data, err := os.ReadFile(fx.cacheFile("c1", "eth0"))
				if err == nil {
					cached = string(data)
				}
			}
			if err := fx.plugin.Add(fx.args("c1", "eth0", fx.conf(ver))); err != nil {
				t.Fatalf("Add: %v", err)
			}
			if cached == "" {
				t.Fatal("the cache entry did not exist when the delegate ran")
			}
			calls := fx.inv.calls
			if len(calls) != 1 || calls[0].Verb != "ADD" || calls[0].Plugin != "bridge" {
				t.Fatalf("delegate calls = %+v, want one bridge ADD", calls)
			}
			if !strings.Contains(cached, calls[0].Conf) {
				t.Errorf("the cache does not hold the configuration the delegate got:\ncache %s\nconf  %s", cached, calls[0].Conf)
			}
			if diff := cmp.Diff(Runtime{ContainerID: "c1", NetNS: "/var/run/netns/c1", IfName: "eth0", Path: "/opt/cni/bin"}, calls[0].RT); diff != "" {
				t.Errorf("delegate runtime (-want +got):\n%s", diff)
			}
			var res struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Address string `json:"address"`
				} `json:"ips"`
			}
			if err := json.Unmarshal(fx.stdout.Bytes(), &res); err != nil {
				t.Fatalf("stdout is not a result: %v\n%s", err, fx.stdout)
			}
			if res.CNIVersion != ver || len(res.IPs) != 1 || res.IPs[0].Address != "10.244.7.2/24" {
				t.Errorf("result = %s, want cniVersion %s with 10.244.7.2/24", fx.stdout, ver)
			}
		})
	}
}

// TestAddRefusesExisting: an ADD of an attachment that exists (its cache
// entry, or the interface in the container's namespace) fails with code
// 105 and touches nothing: no delegate call (so no rollback DEL), the
// existing entry unchanged.
func TestAddRefusesExisting(t *testing.T) {
	t.Run("cache entry", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		before, err := os.ReadFile(fx.cacheFile("c1", "eth0"))
		if err != nil {
			t.Fatal(err)
		}
		fx.inv.calls = nil
		fx.writeEnv("10.244.9.0/24") // even a lease change must not rewrite it
		te := wantCode(t, fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0"))), CodeAlreadyAttached)
		if !strings.Contains(te.Msg, "DEL") {
			t.Errorf("message %q does not say what to do", te.Msg)
		}
		if len(fx.inv.calls) != 0 {
			t.Errorf("delegate calls = %+v, want none", fx.inv.calls)
		}
		if after, err := os.ReadFile(fx.cacheFile("c1", "eth0")); err != nil || !bytes.Equal(before, after) {
			t.Errorf("cache entry changed by the refused ADD (%v):\nbefore %s\nafter  %s", err, before, after)
		}
	})
	t.Run("interface in the namespace", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.exists = map[string]bool{"eth0": true}
		wantCode(t, fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0"))), CodeAlreadyAttached)
		if len(fx.inv.calls) != 0 || exists(fx.cacheFile("c1", "eth0")) {
			t.Errorf("delegate calls %+v, cache entry %v; want neither", fx.inv.calls, exists(fx.cacheFile("c1", "eth0")))
		}
		if err := fx.plugin.Add(fx.args("c1", "eth1", fx.conf("1.1.0"))); err != nil {
			t.Errorf("ADD of another interface: %v", err)
		}
	})
	t.Run("two ADDs at once", func(t *testing.T) {
		// A runtime that sends the same ADD twice at once: both pass the
		// look for an entry before either has written one. The entry is
		// created exclusively, so one goes on and the other is refused
		// without a rollback that would tear the first one's pod down.
		fx := newFixture(t)
		var arrived sync.WaitGroup
		arrived.Add(2)
		fx.inv.onExists = func() { arrived.Done(); arrived.Wait() }
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0"))) })
		}
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("ADDs: %v, %v; want exactly one to succeed", errs[0], errs[1])
		}
		loser := errs[0]
		if loser == nil {
			loser = errs[1]
		}
		wantCode(t, loser, CodeAlreadyAttached)
		if diff := cmp.Diff([]string{"ADD"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
		if _, err := (Cache{Dir: fx.dataDir}).Read(Attachment{"overlay", "c1", "eth0"}); err != nil {
			t.Errorf("the successful ADD's cache entry: %v", err)
		}
	})
}

func TestAddRollsBackOnDelegateFailure(t *testing.T) {
	t.Run("rollback succeeds", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.errs["ADD"] = types.NewError(types.ErrTryAgainLater, "busy", "")
		err := fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0")))
		te := wantCode(t, err, types.ErrTryAgainLater)
		if !strings.Contains(te.Msg, "bridge ADD") {
			t.Errorf("message %q does not name the delegate", te.Msg)
		}
		if diff := cmp.Diff([]string{"ADD", "DEL"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
		if fx.inv.calls[0].Conf != fx.inv.calls[1].Conf {
			t.Error("the rollback DEL did not get the ADD's configuration")
		}
		if exists(fx.cacheFile("c1", "eth0")) {
			t.Error("cache entry left after a successful rollback")
		}
	})
	t.Run("rollback fails too", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.errs["ADD"] = errors.New("exec format error")
		fx.inv.errs["DEL"] = types.NewError(types.ErrIOFailure, "disk on fire", "")
		err := fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0")))
		te := wantCode(t, err, CodeDelegateFailed)
		if !strings.Contains(te.Details, "rollback DEL failed") {
			t.Errorf("details %q do not report the failed rollback", te.Details)
		}
		if !exists(fx.cacheFile("c1", "eth0")) {
			t.Error("cache entry removed although the rollback failed: the runtime's DEL could not clean up")
		}
	})
}

func TestAddWithoutSubnetEnv(t *testing.T) {
	for name, setup := range map[string]func(fx *fixture){
		"missing": func(fx *fixture) { fx.removeEnv() },
		"garbage": func(fx *fixture) {
			if err := os.WriteFile(fx.subnetFile, []byte("OVERLAY_NETWORK=nonsense\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"a directory": func(fx *fixture) {
			fx.removeEnv()
			if err := os.Mkdir(fx.subnetFile, 0o755); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t)
			setup(fx)
			te := wantCode(t, fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0"))), types.ErrTryAgainLater)
			if !strings.Contains(te.Msg, fx.subnetFile) {
				t.Errorf("message %q does not name %s", te.Msg, fx.subnetFile)
			}
			if len(fx.inv.calls) != 0 || exists(fx.cacheFile("c1", "eth0")) {
				t.Errorf("ADD without subnet.env delegated (%v) or cached", fx.inv.verbs())
			}
		})
	}
}

func TestAddCacheNotWritable(t *testing.T) {
	fx := newFixture(t)
	if err := os.WriteFile(fx.dataDir, []byte("a file where the directory should be"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0"))), types.ErrIOFailure)
	if len(fx.inv.calls) != 0 {
		t.Errorf("delegated %v without a cache entry", fx.inv.verbs())
	}
}

func TestVerbsRejectBadAttachments(t *testing.T) {
	for _, tc := range []struct{ cid, ifname string }{
		{"../../etc", "eth0"}, {"a/b", "eth0"}, {"..", "eth0"}, {"a\x00b", "eth0"}, {"", "eth0"},
		{"c1", ".."}, {"c1", "a/b"}, {"c1", "e\x00th"}, {"c1", ""}, {"c1", "x..y"},
	} {
		fx := newFixture(t)
		for verb, f := range map[string]func(*skel.CmdArgs) error{"ADD": fx.plugin.Add, "DEL": fx.plugin.Del, "CHECK": fx.plugin.Check} {
			t.Run(fmt.Sprintf("%s %q %q", verb, tc.cid, tc.ifname), func(t *testing.T) {
				conf := fx.conf("1.1.0", `"prevResult":{"cniVersion":"1.1.0"}`)
				wantCode(t, f(fx.args(tc.cid, tc.ifname, conf)), types.ErrInvalidEnvironmentVariables)
				if len(fx.inv.calls) != 0 {
					t.Errorf("delegated %v", fx.inv.verbs())
				}
			})
		}
	}
}

func TestVerbsRejectBadConfig(t *testing.T) {
	fx := newFixture(t)
	bad := []byte(`{"cniVersion":"1.1.0","name":"overlay","delegate":{"type":"/bin/sh"}}`)
	for verb, f := range map[string]func(*skel.CmdArgs) error{
		"ADD": fx.plugin.Add, "DEL": fx.plugin.Del, "CHECK": fx.plugin.Check, "STATUS": fx.plugin.Status, "GC": fx.plugin.GC,
	} {
		t.Run(verb, func(t *testing.T) {
			wantCode(t, f(fx.args("c1", "eth0", bad)), types.ErrInvalidNetworkConfig)
		})
	}
}

func TestDel(t *testing.T) {
	t.Run("replays the cache even after the lease changed and removes it", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		addConf := fx.inv.calls[0].Conf
		fx.writeEnv("10.244.9.0/24")
		args := fx.args("c1", "eth0", fx.conf("1.1.0"))
		args.Netns = ""
		if err := fx.plugin.Del(args); err != nil {
			t.Fatalf("Del: %v", err)
		}
		del := fx.inv.calls[1]
		if del.Verb != "DEL" || del.Conf != addConf || del.RT.NetNS != "" {
			t.Errorf("DEL call = %+v, want the ADD's configuration and an empty netns", del)
		}
		if exists(fx.cacheFile("c1", "eth0")) {
			t.Error("cache entry left after a successful DEL")
		}
		if err := fx.plugin.Del(args); err != nil {
			t.Fatalf("second Del: %v", err)
		}
	})
	t.Run("works with the daemon gone", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		fx.removeEnv()
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if diff := cmp.Diff([]string{"ADD", "DEL"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
	})
	t.Run("delegate failure keeps the cache", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		fx.inv.errs["DEL"] = types.NewError(types.ErrIOFailure, "no", "")
		te := wantCode(t, fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))), types.ErrIOFailure)
		if !strings.Contains(te.Msg, "kept") {
			t.Errorf("message %q does not say the cache entry is kept", te.Msg)
		}
		if !exists(fx.cacheFile("c1", "eth0")) {
			t.Fatal("cache entry removed although the delegate DEL failed")
		}
		delete(fx.inv.errs, "DEL")
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("retried Del: %v", err)
		}
		if exists(fx.cacheFile("c1", "eth0")) {
			t.Error("cache entry left after the retried DEL succeeded")
		}
	})
	t.Run("no cache re-renders from subnet.env", func(t *testing.T) {
		fx := newFixture(t)
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if len(fx.inv.calls) != 1 || fx.inv.calls[0].Verb != "DEL" || !strings.Contains(fx.inv.calls[0].Conf, `"subnet":"10.244.7.0/24"`) {
			t.Errorf("delegate calls = %+v, want one DEL with the rendered configuration", fx.inv.calls)
		}
	})
	t.Run("no cache and no subnet.env succeeds", func(t *testing.T) {
		fx := newFixture(t)
		fx.removeEnv()
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if len(fx.inv.calls) != 0 {
			t.Errorf("delegated %v with nothing to delegate", fx.inv.verbs())
		}
	})
	t.Run("corrupt cache falls back to subnet.env and is removed", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		if err := os.WriteFile(fx.cacheFile("c1", "eth0"), []byte(`{"format":1,"net`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if diff := cmp.Diff([]string{"ADD", "DEL"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
		if exists(fx.cacheFile("c1", "eth0")) {
			t.Error("corrupt cache entry left after a successful DEL")
		}
		if !strings.Contains(fx.stderr.String(), "cannot use the cache entry") {
			t.Errorf("stderr %q does not explain the fallback", fx.stderr)
		}
	})
	t.Run("no cache and a configuration that cannot be rendered succeeds", func(t *testing.T) {
		// An IPv6 route on an IPv4-only host: ADD failed before it made
		// anything, and a DEL error would be repeated on every retry.
		fx := newFixture(t)
		conf := []byte(strings.Replace(string(fx.conf("1.1.0")), `"ipam":{`, `"ipam":{"routes":[{"dst":"fd99::/64"}],`, 1))
		wantCode(t, fx.plugin.Add(fx.args("c1", "eth0", conf)), types.ErrInvalidNetworkConfig)
		if err := fx.plugin.Del(fx.args("c1", "eth0", conf)); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if len(fx.inv.calls) != 0 {
			t.Errorf("delegated %v with nothing to delegate", fx.inv.verbs())
		}
		if !strings.Contains(fx.stderr.String(), "cannot be rendered") {
			t.Errorf("stderr %q does not say why nothing was released", fx.stderr)
		}
	})
	t.Run("another attachment's entry under the same file name is left alone", func(t *testing.T) {
		// "overlay-x-y-z" is both (x, y-z) and (x-y, z).
		fx := newFixture(t)
		if err := fx.plugin.Add(fx.args("x", "y-z", fx.conf("1.1.0"))); err != nil {
			t.Fatal(err)
		}
		if err := fx.plugin.Del(fx.args("x-y", "z", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if _, err := (Cache{Dir: fx.dataDir}).Read(Attachment{"overlay", "x", "y-z"}); err != nil {
			t.Errorf("the other attachment's entry after this DEL: %v", err)
		}
	})
	t.Run("the plugin's own namespace is refused before anything is touched", func(t *testing.T) {
		// bridge's DEL there would delete the host's interface named
		// CNI_IFNAME; the CNI library only objects after the DEL ran.
		fx := newFixture(t)
		fx.add("c1")
		fx.inv.calls = nil
		args := fx.args("c1", "eth0", fx.conf("1.1.0"))
		args.Netns = "/proc/self/ns/net"
		wantCode(t, fx.plugin.Del(args), types.ErrInvalidNetNS)
		if len(fx.inv.calls) != 0 || !exists(fx.cacheFile("c1", "eth0")) {
			t.Errorf("delegate calls %v, cache entry kept %v; want none and kept", fx.inv.verbs(), exists(fx.cacheFile("c1", "eth0")))
		}
		args.NetnsOverride = "1"
		if err := fx.plugin.Del(args); err != nil {
			t.Errorf("Del with CNI_NETNS_OVERRIDE: %v", err)
		}
	})
	t.Run("corrupt cache and no subnet.env succeeds", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		if err := os.WriteFile(fx.cacheFile("c1", "eth0"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		fx.removeEnv()
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf("1.1.0"))); err != nil {
			t.Fatalf("Del: %v", err)
		}
	})
}

func TestCheck(t *testing.T) {
	prev := `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/c1"}],"ips":[{"address":"10.244.7.2/24","gateway":"10.244.7.1","interface":0}]}`
	t.Run("passes the cached configuration with prevResult", func(t *testing.T) {
		fx := newFixture(t)
		fx.add("c1")
		if err := fx.plugin.Check(fx.args("c1", "eth0", fx.conf("1.0.0", prev))); err != nil {
			t.Fatalf("Check: %v", err)
		}
		chk := fx.inv.calls[1]
		var got struct {
			CNIVersion string `json:"cniVersion"`
			PrevResult struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Address string `json:"address"`
				} `json:"ips"`
			} `json:"prevResult"`
		}
		if err := json.Unmarshal([]byte(chk.Conf), &got); err != nil {
			t.Fatal(err)
		}
		if chk.Verb != "CHECK" || got.CNIVersion != "1.1.0" || got.PrevResult.CNIVersion != "1.1.0" ||
			len(got.PrevResult.IPs) != 1 || got.PrevResult.IPs[0].Address != "10.244.7.2/24" {
			t.Errorf("CHECK call %+v: want the cached 1.1.0 configuration with the prevResult converted to 1.1.0", chk)
		}
	})
	for _, tc := range []struct {
		name  string
		setup func(fx *fixture)
		conf  func(fx *fixture) []byte
		code  uint
	}{
		{"no prevResult", func(fx *fixture) { fx.add("c1") }, func(fx *fixture) []byte { return fx.conf("1.1.0") }, types.ErrInvalidNetworkConfig},
		{"no cache", func(fx *fixture) {}, nil, CodeNoCache},
		{"corrupt cache", func(fx *fixture) {
			fx.add("c1")
			if err := os.WriteFile(fx.cacheFile("c1", "eth0"), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, nil, CodeCacheCorrupt},
		{"no subnet.env", func(fx *fixture) { fx.add("c1"); fx.removeEnv() }, nil, types.ErrTryAgainLater},
		{"lease changed", func(fx *fixture) { fx.add("c1"); fx.writeEnv("10.244.9.0/24") }, nil, CodeLeaseChanged},
		{"delegate says no", func(fx *fixture) {
			fx.add("c1")
			fx.inv.errs["CHECK"] = types.NewError(types.ErrInvalidNetworkConfig, "no eth0", "")
		}, nil, types.ErrInvalidNetworkConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			tc.setup(fx)
			conf := fx.conf("1.1.0", prev)
			if tc.conf != nil {
				conf = tc.conf(fx)
			}
			wantCode(t, fx.plugin.Check(fx.args("c1", "eth0", conf)), tc.code)
		})
	}
}

func TestStatus(t *testing.T) {
	t.Run("ready", func(t *testing.T) {
		fx := newFixture(t)
		if err := fx.plugin.Status(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: fx.conf("1.1.0")}); err != nil {
			t.Fatalf("Status: %v", err)
		}
		if len(fx.inv.calls) != 1 || fx.inv.calls[0].Verb != "STATUS" || fx.inv.calls[0].RT != (Runtime{Path: "/opt/cni/bin"}) {
			t.Errorf("delegate calls = %+v, want one STATUS", fx.inv.calls)
		}
		if !slices.Equal(fx.inv.readyz, []string{DefaultHealthAddr}) {
			t.Errorf("asked overlayd at %v, want %s", fx.inv.readyz, DefaultHealthAddr)
		}
	})
	t.Run("no subnet.env", func(t *testing.T) {
		fx := newFixture(t)
		fx.removeEnv()
		te := wantCode(t, fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0")}), types.ErrPluginNotAvailable)
		if !strings.Contains(te.Msg, fx.subnetFile) {
			t.Errorf("message %q does not name %s", te.Msg, fx.subnetFile)
		}
	})
	t.Run("invalid subnet.env", func(t *testing.T) {
		fx := newFixture(t)
		if err := os.WriteFile(fx.subnetFile, []byte("OVERLAY_MTU=12\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		wantCode(t, fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0")}), types.ErrPluginNotAvailable)
	})
	t.Run("overlayd not ready", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.errs["READYZ"] = fmt.Errorf("%w: 127.0.0.1:9436/readyz answered 503: not ready: etcd session lost", ErrDaemonNotReady)
		te := wantCode(t, fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0")}), types.ErrPluginNotAvailable)
		if !strings.Contains(te.Msg, DefaultHealthAddr) || !strings.Contains(te.Details, "etcd session lost") {
			t.Errorf("error %+v does not name the address and the daemon's reasons", te)
		}
		if len(fx.inv.calls) != 0 {
			t.Errorf("delegate calls = %+v, want none", fx.inv.calls)
		}
	})
	t.Run("healthAddr set", func(t *testing.T) {
		fx := newFixture(t)
		if err := fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0", `"healthAddr":"127.0.0.2:19436"`)}); err != nil {
			t.Fatalf("Status: %v", err)
		}
		if !slices.Equal(fx.inv.readyz, []string{"127.0.0.2:19436"}) {
			t.Errorf("asked overlayd at %v, want 127.0.0.2:19436", fx.inv.readyz)
		}
	})
	t.Run("healthAddr empty: overlayd not asked", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.errs["READYZ"] = ErrDaemonNotReady
		if err := fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0", `"healthAddr":""`)}); err != nil {
			t.Fatalf("Status: %v", err)
		}
		if len(fx.inv.readyz) != 0 {
			t.Errorf("asked overlayd at %v", fx.inv.readyz)
		}
	})
	t.Run("delegate not available", func(t *testing.T) {
		fx := newFixture(t)
		fx.inv.errs["STATUS"] = types.NewError(types.ErrLimitedConnectivity, "ipam gone", "")
		wantCode(t, fx.plugin.Status(&skel.CmdArgs{StdinData: fx.conf("1.1.0")}), types.ErrLimitedConnectivity)
	})
}

func TestGC(t *testing.T) {
	valid := `"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"},{"containerID":"broken-keep","ifname":"eth0"}]`
	setup := func(t *testing.T) *fixture {
		fx := newFixture(t)
		fx.add("keep")
		fx.add("stale1")
		fx.add("stale2")
		for _, cid := range []string{"broken-keep", "broken-stale"} {
			if err := os.WriteFile(fx.cacheFile(cid, "eth0"), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		writeHostLocal(t, filepath.Join(fx.ipamDir, "overlay"), map[string]string{
			"lock": "", "last_reserved_ip.0": "10.244.7.9",
			"10.244.7.2": "keep\r\neth0", "10.244.7.9": "nocache\r\neth0",
		})
		fx.inv.calls = nil
		return fx
	}
	t.Run("removes stale attachments and keeps valid ones", func(t *testing.T) {
		fx := setup(t)
		if err := fx.plugin.GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: fx.conf("1.1.0", valid)}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		var dels []Runtime
		var gc *call
		for i, c := range fx.inv.calls {
			switch c.Verb {
			case "DEL":
				dels = append(dels, c.RT)
			case "GC":
				gc = &fx.inv.calls[i]
			}
		}
		wantDels := []Runtime{
			{ContainerID: "stale1", IfName: "eth0", Path: "/opt/cni/bin"},
			{ContainerID: "stale2", IfName: "eth0", Path: "/opt/cni/bin"},
		}
		if diff := cmp.Diff(wantDels, dels); diff != "" {
			t.Errorf("stale DELs (-want +got):\n%s", diff)
		}
		if gc == nil || !strings.Contains(gc.Conf, `"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}`) {
			t.Errorf("delegate GC = %+v, want one with the valid attachments", gc)
		}
		if diff := cmp.Diff([]string{"overlay-broken-keep-eth0", "overlay-keep-eth0"}, dirNames(t, fx.dataDir)); diff != "" {
			t.Errorf("cache after GC (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"10.244.7.2", "last_reserved_ip.0", "lock"}, dirNames(t, filepath.Join(fx.ipamDir, "overlay"))); diff != "" {
			t.Errorf("host-local after GC (-want +got):\n%s", diff)
		}
	})
	t.Run("null valid attachments mean none", func(t *testing.T) {
		// What libcni sends for a runtime's empty list (CRI-O's GC of a
		// network without pods): everything cached is stale.
		fx := setup(t)
		conf := fx.conf("1.1.0", `"cni.dev/valid-attachments":null`, `"cni.dev/attachments":null`)
		if err := fx.plugin.GC(&skel.CmdArgs{StdinData: conf}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if names := dirNames(t, fx.dataDir); len(names) != 0 {
			t.Errorf("cache after GC: %v, want it empty", names)
		}
	})
	t.Run("a configuration that cannot be rendered skips only the delegate GC", func(t *testing.T) {
		fx := setup(t)
		conf := []byte(strings.Replace(string(fx.conf("1.1.0", valid)), `"ipam":{`, `"ipam":{"routes":[{"dst":"fd99::/64"}],`, 1))
		if err := fx.plugin.GC(&skel.CmdArgs{StdinData: conf}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if diff := cmp.Diff([]string{"DEL", "DEL"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
	})
	t.Run("accepts cni.dev/attachments", func(t *testing.T) {
		fx := setup(t)
		conf := fx.conf("1.1.0", strings.Replace(valid, "valid-attachments", "attachments", 1))
		if err := fx.plugin.GC(&skel.CmdArgs{StdinData: conf}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if !exists(fx.cacheFile("keep", "eth0")) || exists(fx.cacheFile("stale1", "eth0")) {
			t.Error("cni.dev/attachments was not honoured")
		}
	})
	t.Run("continues past errors and reports them", func(t *testing.T) {
		fx := setup(t)
		fx.inv.errs["DEL"] = types.NewError(types.ErrIOFailure, "cannot", "")
		fx.inv.errs["GC"] = errors.New("gc broke")
		te := wantCode(t, fx.plugin.GC(&skel.CmdArgs{StdinData: fx.conf("1.1.0", valid)}), CodeGCIncomplete)
		for _, want := range []string{"stale1", "stale2", "gc broke"} {
			if !strings.Contains(te.Details, want) {
				t.Errorf("details %q do not mention %q", te.Details, want)
			}
		}
		if !exists(fx.cacheFile("stale1", "eth0")) || !exists(fx.cacheFile("stale2", "eth0")) {
			t.Error("cache entries of failed DELs were removed")
		}
		// The sweep still ran: the reservation without a cache is gone.
		if diff := cmp.Diff([]string{"10.244.7.2", "last_reserved_ip.0", "lock"}, dirNames(t, filepath.Join(fx.ipamDir, "overlay"))); diff != "" {
			t.Errorf("host-local after GC (-want +got):\n%s", diff)
		}
	})
	t.Run("without subnet.env skips only the delegate GC", func(t *testing.T) {
		fx := setup(t)
		fx.removeEnv()
		if err := fx.plugin.GC(&skel.CmdArgs{StdinData: fx.conf("1.1.0", valid)}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if diff := cmp.Diff([]string{"DEL", "DEL"}, fx.inv.verbs()); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
	})
	t.Run("refuses without a valid list", func(t *testing.T) {
		fx := setup(t)
		wantCode(t, fx.plugin.GC(&skel.CmdArgs{StdinData: fx.conf("1.1.0")}), types.ErrInvalidNetworkConfig)
		if len(fx.inv.calls) != 0 || !exists(fx.cacheFile("stale1", "eth0")) {
			t.Error("GC without a valid list removed something")
		}
	})
	t.Run("an empty valid list removes everything", func(t *testing.T) {
		fx := setup(t)
		if err := fx.plugin.GC(&skel.CmdArgs{StdinData: fx.conf("1.1.0", `"cni.dev/valid-attachments":[]`)}); err != nil {
			t.Fatalf("GC: %v", err)
		}
		if names := dirNames(t, fx.dataDir); len(names) != 0 {
			t.Errorf("cache after GC = %v, want empty", names)
		}
	})
}

// TestFuncs: skel gets all five verbs, so none is answered with a silent
// success by the library.
func TestFuncs(t *testing.T) {
	f := New(&fakeInvoker{}, nil, nil).Funcs()
	if f.Add == nil || f.Del == nil || f.Check == nil || f.Status == nil || f.GC == nil {
		t.Fatalf("Funcs() leaves a verb nil: %+v", f)
	}
}

// TestAddOnAFullDisk: an ADD whose cache entry cannot be written for lack
// of space fails with code 5 saying so (it said "make dataDir writable by
// root"), names the entry once in its details, delegates nothing and
// leaves no file in dataDir.
func TestAddOnAFullDisk(t *testing.T) {
	fx := newFixture(t)
	var err error
	var left []string
	if ferr := testenv.InFullFS(t, func(dir string) error {
		fx.dataDir = dir
		err = fx.plugin.Add(fx.args("c1", "eth0", fx.conf("1.1.0")))
		entries, rerr := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, e.Name())
		}
		return rerr
	}); ferr != nil {
		t.Fatal(ferr)
	}
	te, ok := errors.AsType[*types.Error](err)
	if !ok || te.Code != types.ErrIOFailure || !strings.Contains(te.Msg, "its file system is full: free space there") ||
		strings.Count(te.Details, "overlay-c1-eth0") != 1 || strings.Contains(te.Details, ".tmp-") {
		t.Errorf("ADD on a full disk = %v (%+v), want code 5 saying the file system is full, naming the entry once", err, te)
	}
	if len(fx.inv.calls) != 0 {
		t.Errorf("ADD delegated %v", fx.inv.calls)
	}
	if len(left) != 0 {
		t.Errorf("files left in dataDir: %q", left)
	}
}
