package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/overlaynet/overlay/internal/testing/cnifuzz"
	"github.com/overlaynet/overlay/subnet"
)

// Fuzz targets for hostile CNI input (issue #8, part 5). Each case runs in a
// sandbox (package cnifuzz) with a fake delegate; see cnifuzz.Policy for the
// exact rule of what a verb may change. `make fuzz` runs each for 10 s.

var fuzzVerbs = []string{"ADD", "DEL", "CHECK", "STATUS", "GC"}

// codesOfOurs are the codes a verb may return on its own; the fake delegate
// fails with types.ErrTryAgainLater, which is passed through.
var codesOfOurs = []uint{
	types.ErrInvalidEnvironmentVariables, types.ErrIOFailure, types.ErrDecodingFailure,
	types.ErrInvalidNetworkConfig, types.ErrInvalidNetNS, types.ErrTryAgainLater, types.ErrPluginNotAvailable,
	CodeNoCache, CodeLeaseChanged, CodeCacheCorrupt, CodeDelegateFailed, CodeGCIncomplete, CodeAlreadyAttached,
}

func (p *Plugin) verb(name string) func(*skel.CmdArgs) error {
	return map[string]func(*skel.CmdArgs) error{
		"ADD": p.Add, "DEL": p.Del, "CHECK": p.Check, "STATUS": p.Status, "GC": p.GC,
	}[name]
}

// verbCase is one input of FuzzVerbs.
type verbCase struct {
	Verb                      uint8  // fuzzVerbs[Verb%5]
	Stdin                     []byte // the network configuration, confined to the sandbox
	ContainerID, IfName       string // CNI_CONTAINERID, CNI_IFNAME, as given
	NetNS                     string // free-form part of CNI_NETNS (cnifuzz.NetNSValue, selector 7)
	Args, Path                string // CNI_ARGS, CNI_PATH, as given
	DataDir, SubnetFile, IPAM uint8  // selectors of cnifuzz.*Value
	Flags                     uint8  // see the flag* constants
	Free                      string // free-form path for the selectors that take one
	Fail                      uint8  // bit i fails fuzzVerbs[i] in the fake delegate; bit 5: with a plain error
}

const (
	flagNetNS       = 0x07 // selector of cnifuzz.NetNSValue
	flagPrepare     = 0x08 // cache the attachment (and a stale one) before the verb
	flagHostileLock = 0x10 // host-local's lock is a dangling link into the decoy
	flagOverride    = 0x20 // CNI_NETNS_OVERRIDE=1
	flagCachedVer   = 0xc0 // cniVersion of the prepared entry: 1.1.0, 1.0.0, 0.4.0, 0.3.1
)

var cachedVersions = []string{"1.1.0", "1.0.0", "0.4.0", "0.3.1"}

func (vc verbCase) failErr(verb string) error {
	i := slices.Index(fuzzVerbs, verb)
	if vc.Fail&(1<<i) == 0 {
		return nil
	}
	if vc.Fail&0x20 != 0 {
		return errors.New("fake delegate: exec format error")
	}
	return types.NewError(types.ErrTryAgainLater, "fake delegate: busy", "")
}

// run runs one case and checks every invariant; it returns the verb's error
// for the table tests.
func (vc verbCase) run(t *testing.T) error {
	t.Helper()
	verb := fuzzVerbs[int(vc.Verb)%len(fuzzVerbs)]
	sb := cnifuzz.New(t)
	dataV, dataGood := sb.DataDirValue(vc.DataDir, vc.Free)
	prepared := false // the attachment's own cache entry was written before the verb
	envV, envGood := sb.SubnetFileValue(vc.SubnetFile, vc.Free)
	conf := cnifuzz.Confine(vc.Stdin, dataV, envV, sb.IPAMDataDirValue(vc.IPAM, vc.Free))
	netns := sb.NetNSValue(vc.Flags&flagNetNS, vc.NetNS)
	override := vc.Flags&flagOverride != 0

	c, perr := ParseConf(conf)
	att := Attachment{ContainerID: vc.ContainerID, IfName: vc.IfName}
	policy := cnifuzz.Policy{Verb: "nothing"}
	if perr == nil {
		att.Network = c.Name
		checkConfined(t, sb, c)
		policy = cnifuzz.Policy{Verb: verb, DataDir: c.DataDir, HostLocalDir: c.HostLocalDir(),
			Network: c.Name, ContainerID: vc.ContainerID, IfName: vc.IfName}
		sb.PrepareHostLocal(c.HostLocalDir(), vc.Flags&flagHostileLock != 0)
		if vc.Flags&flagPrepare != 0 && dataGood && att.Validate() == nil {
			pc := *c
			pc.CNIVersion = cachedVersions[vc.Flags>>6]
			d, err := Render(&pc, subnet.NewEnv(cnifuzz.Network, cnifuzz.Lease, 1450, true))
			if err != nil {
				t.Fatal(err)
			}
			cache := Cache{Dir: c.DataDir}
			for i, a := range []Attachment{att, {Network: c.Name, ContainerID: "stale", IfName: "eth0"}} {
				err := cache.Write(a, d)
				if err != nil && !errors.Is(err, ErrInvalidAttachment) {
					t.Fatalf("prepare the cache: %v", err)
				}
				prepared = prepared || i == 0 && err == nil
			}
		}
	}

	before := sb.Snapshot(t)
	inv := &fakeInvoker{errs: map[string]error{}}
	for _, v := range fuzzVerbs {
		if err := vc.failErr(v); err != nil {
			inv.errs[v] = err
		}
	}
	var stdout, stderr bytes.Buffer
	p := New(inv, &stdout, &stderr)
	standIn := sb.Path(cnifuzz.NetNS) // a regular file standing for the pod's namespace
	p.netns = acceptStandIns(func(path string) bool { return path == standIn })
	args := &skel.CmdArgs{ContainerID: vc.ContainerID, Netns: netns, IfName: vc.IfName, Args: vc.Args, Path: vc.Path,
		StdinData: conf}
	if override {
		args.NetnsOverride = "1"
	}
	err := p.verb(verb)(args)
	changes := cnifuzz.Diff(before, sb.Snapshot(t))

	// The outcome is success or a CNI error with a code of ours (or the
	// fake delegate's), and stdout holds a result only after a successful ADD.
	var te *types.Error
	if err != nil {
		if !errors.As(err, &te) {
			t.Fatalf("%s returned %T %v, not a *types.Error", verb, err, err)
		}
		if !slices.Contains(codesOfOurs, te.Code) || te.Msg == "" {
			t.Fatalf("%s returned code %d (%q): not one of ours", verb, te.Code, te.Msg)
		}
		if stdout.Len() != 0 {
			t.Fatalf("%s failed (%v) but wrote to stdout: %q", verb, err, stdout.String())
		}
	} else if verb == "ADD" {
		var res struct {
			CNIVersion string `json:"cniVersion"`
		}
		if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil || res.CNIVersion != c.CNIVersion {
			t.Fatalf("ADD succeeded with stdout %q: want a result in cniVersion %q", stdout.String(), c.CNIVersion)
		}
	} else if stdout.Len() != 0 {
		t.Fatalf("%s wrote to stdout: %q", verb, stdout.String())
	}
	// The exact rule of what may change in the sandbox.
	if perr := policy.Check(changes); perr != nil {
		t.Fatalf("%v\n(outcome: %v)", perr, err)
	}
	if perr != nil {
		if te == nil || te.Code != types.ErrInvalidNetworkConfig || len(inv.calls) != 0 {
			t.Fatalf("%s of a configuration ParseConf refuses (%v): %v and delegate calls %v, want code 7 and none", verb, perr, err, inv.verbs())
		}
		return err
	}
	checkDelegateCalls(t, verb, c, args, inv.calls, p.netns)

	// Expected outcomes where they are certain.
	attVerb := verb == "ADD" || verb == "DEL" || verb == "CHECK"
	badNetNS := false
	if fi, serr := os.Stat(netns); netns != "" && serr == nil && fi.Mode()&(fs.ModeNamedPipe|fs.ModeDevice) != 0 {
		badNetNS = true
	}
	// ADD and CHECK also need a namespace: the stand-in or a real one.
	if (verb == "ADD" || verb == "CHECK") && netns != standIn && netns != "/proc/self/ns/net" {
		badNetNS = true
	}
	ownNetNS := attVerb && !override && netns == "/proc/self/ns/net"
	switch {
	case attVerb && att.Validate() != nil:
		if te == nil || te.Code != types.ErrInvalidEnvironmentVariables || len(inv.calls) != 0 || len(changes) != 0 {
			t.Fatalf("%s of invalid %s: %v, delegate calls %v, changes %v; want code 4 and nothing done", verb, att, err, inv.verbs(), changes)
		}
	case attVerb && (badNetNS || ownNetNS):
		want := uint(types.ErrInvalidEnvironmentVariables)
		if !badNetNS {
			want = types.ErrInvalidNetNS
		}
		if te == nil || te.Code != want || len(inv.calls) != 0 || len(changes) != 0 {
			t.Fatalf("%s with CNI_NETNS %q: %v, delegate calls %v, changes %v; want code %d and nothing done", verb, netns, err, inv.verbs(), changes, want)
		}
	case verb == "DEL" && vc.failErr("DEL") == nil:
		// DEL must not leave a pod stuck: whatever the cache or subnet.env.
		if err != nil {
			t.Fatalf("DEL of %s failed although the delegate succeeds: %v", att, err)
		}
	case verb == "ADD" && prepared:
		// An existing attachment is never touched by a repeated ADD.
		if te == nil || te.Code != CodeAlreadyAttached || len(inv.calls) != 0 || len(changes) != 0 {
			t.Fatalf("ADD of the attached %s: %v, delegate calls %v, changes %v; want code %d and nothing done", att, err, inv.verbs(), changes, CodeAlreadyAttached)
		}
	case verb == "ADD" && dataGood && envGood && vc.failErr("ADD") == nil:
		if err != nil {
			_, verr := inv.addResult().GetAsVersion(c.CNIVersion)
			if te.Code != CodeDelegateFailed || verr == nil {
				t.Fatalf("ADD of %s failed: %v", att, err)
			}
			break
		}
		checkAdded(t, c, att, inv.calls[0].Conf)
	case verb == "STATUS" && envGood && vc.failErr("STATUS") == nil:
		if err != nil {
			t.Fatalf("STATUS with a valid subnet.env: %v", err)
		}
	case verb == "STATUS" && !envGood:
		if te == nil || te.Code != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS without a usable subnet.env: %v, want code 50", err)
		}
	}
	return err
}

// checkConfined is the harness's own guard, checked before anything runs:
// every path the accepted configuration names is in the sandbox, and
// host-local (which decodes its ipam section with encoding/json) would use
// the very directory GC sweeps.
func checkConfined(t *testing.T, sb *cnifuzz.Sandbox, c *NetConf) {
	t.Helper()
	if err := sb.CheckConfined(map[string]string{"dataDir": c.DataDir, "subnetFile": c.SubnetFile, "host-local directory": c.HostLocalDir()}); err != nil {
		t.Fatalf("accepted configuration: %v", err)
	}
	d, err := Render(c, subnet.NewEnv(cnifuzz.Network, cnifuzz.Lease, 1450, true))
	if err != nil {
		t.Fatalf("ParseConf accepted the configuration but Render failed: %v", err)
	}
	var seen struct {
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
		Type       string `json:"type"`
		IPAM       struct {
			Type    string `json:"type"`
			DataDir string `json:"dataDir"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(d.Config, &seen); err != nil {
		t.Fatalf("rendered configuration: %v", err)
	}
	dir := seen.IPAM.DataDir
	if dir == "" {
		dir = HostLocalDefaultDataDir
	}
	if got := filepath.Join(dir, seen.Name); got != c.HostLocalDir() {
		t.Fatalf("host-local keeps its reservations in %s but GC sweeps %s:\n%s", got, c.HostLocalDir(), d.Config)
	}
	if seen.Name != c.Name || seen.CNIVersion != c.CNIVersion || seen.Type != c.DelegateType || seen.IPAM.Type != "host-local" {
		t.Fatalf("the delegate would read name %q, cniVersion %q, type %q, ipam.type %q from %s", seen.Name, seen.CNIVersion, seen.Type, seen.IPAM.Type, d.Config)
	}
}

// checkDelegateCalls: the delegate is only ever run as a plain plugin name,
// with a configuration of this network, and with the runtime's values
// (ADD, DEL, CHECK), none (STATUS, GC) or a validated attachment from the
// cache and an empty netns (GC's DELs).
func checkDelegateCalls(t *testing.T, verb string, c *NetConf, args *skel.CmdArgs, calls []call, netnsOK func(string) error) {
	t.Helper()
	var verbs []string
	for _, cl := range calls {
		verbs = append(verbs, cl.Verb)
		var conf struct {
			Type       string `json:"type"`
			Name       string `json:"name"`
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal([]byte(cl.Conf), &conf); err != nil || conf.Type != cl.Plugin || conf.Name != c.Name || conf.CNIVersion == "" {
			t.Fatalf("%s ran %s %s with configuration %s", verb, cl.Plugin, cl.Verb, cl.Conf)
		}
		if !validPluginName(cl.Plugin) {
			t.Fatalf("%s ran delegate %q", verb, cl.Plugin)
		}
		var want Runtime
		switch {
		case verb == "ADD" || verb == "DEL" || verb == "CHECK":
			want = runtimeOf(args)
			if verb == "DEL" && want.NetNS != "" && netnsOK != nil && netnsOK(want.NetNS) != nil {
				want.NetNS = "" // gone or no namespace: passed on empty
			}
		case verb == "GC" && cl.Verb == "DEL":
			want = Runtime{ContainerID: cl.RT.ContainerID, IfName: cl.RT.IfName, Path: args.Path}
			if err := (Attachment{Network: c.Name, ContainerID: cl.RT.ContainerID, IfName: cl.RT.IfName}).Validate(); err != nil {
				t.Fatalf("GC deleted an attachment it should never have read: %v", err)
			}
		default:
			want = Runtime{Path: args.Path}
		}
		if cl.RT != want {
			t.Fatalf("%s ran %s %s with %+v, want %+v", verb, cl.Plugin, cl.Verb, cl.RT, want)
		}
	}
	seq := strings.Join(verbs, " ")
	ok := false
	switch verb {
	case "ADD":
		ok = seq == "" || seq == "ADD" || seq == "ADD DEL"
	case "DEL", "CHECK", "STATUS":
		ok = seq == "" || seq == verb
	case "GC": // DELs of stale attachments, then the delegate's GC
		ok = true
		for i, v := range verbs {
			ok = ok && (v == "DEL" || v == "GC" && i == len(verbs)-1)
		}
	}
	if !ok {
		t.Fatalf("%s ran the delegate's %q", verb, seq)
	}
}

// checkAdded: after a successful ADD the entry is there, readable, private,
// and holds what the delegate got.
func checkAdded(t *testing.T, c *NetConf, att Attachment, conf string) {
	t.Helper()
	cache := Cache{Dir: c.DataDir}
	e, err := cache.Read(att)
	if err != nil {
		t.Fatalf("ADD succeeded but its cache entry cannot be read: %v", err)
	}
	if string(e.Delegate.Config) != conf {
		t.Fatalf("cache entry holds %s, the delegate got %s", e.Delegate.Config, conf)
	}
	p, _ := cache.Path(att)
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != CacheFileMode {
		t.Fatalf("cache entry %s: %v, mode %v", p, err, fi.Mode())
	}
	if fi, err := os.Stat(c.DataDir); err != nil || fi.Mode().Perm() != CacheDirMode {
		t.Fatalf("cache directory %s: %v, mode %v", c.DataDir, err, fi.Mode())
	}
}

// addResult is the result the fake delegate's ADD returns.
func (f *fakeInvoker) addResult() types.Result {
	res, _ := (&fakeInvoker{}).Add(context.Background(), "", nil, Runtime{IfName: "eth0"})
	return res
}

// hostileConfs are network configurations for the seeds: the paths in them
// are replaced by cnifuzz.Confine, only the keys and the rest matter.
var hostileConfs = []string{
	`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni"}`,
	`{"cniVersion":"0.4.0","name":"overlay","type":"overlay-cni","delegate":{"hairpinMode":true},"ipam":{"routes":[{"dst":"0.0.0.0/0"}]}}`,
	`{"cniVersion":"1.1.0","name":"overlay","dataDir":"../../../../var/lib/cni","subnetFile":"/etc/shadow","ipam":{"dataDir":"/var/lib/cni/networks"}}`,
	`{"cniVersion":"1.1.0","name":"overlay","DataDir":"/var/lib/cni/overlay","SUBNETFILE":"/run/overlay/subnet.env"}`,
	`{"cniVersion":"1.1.0","name":"overlay","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.244.7.2/24","interface":0}]}}`,
	`{"cniVersion":"1.1.0","name":"overlay","prevResult":{"cniVersion":"1.1.0","ips":[null],"routes":[null],"interfaces":[null]}}`,
	`{"cniVersion":"1.1.0","name":"overlay","cni.dev/valid-attachments":[{"containerID":"../../outside","ifname":"eth0"},{"containerID":"c1","ifname":"eth0"}]}`,
	`{"cniVersion":"1.1.0","name":"overlay","cni.dev/attachments":[]}`,
	`{"cniVersion":"1.1.0","name":"../../outside"}`,
	`{"cniVersion":"1.1.0","name":"overlay/../../outside"}`,
	`{"cniVersion":"1.1.0","name":"` + strings.Repeat("n", 128) + `"}`,
	`{"cniVersion":"1.1.0","name":"övérlay"}`,
	`{"cniVersion":"1.1.0","name":"overlay","delegate":{"type":"../../bin/sh"}}`,
	`{"cniVersion":"1.1.0","name":"overlay","delegate":{"cniversion":"0.1.0","prevresult":{}}}`,
	`{"cniVersion":"1.1.0","name":"overlay","ipam":{"datadir":"/var/lib/cni/networks"}}`,
	`{"cniVersion":"1.1.0","name":"overlay","delegate":{"ipam":{"DataDir":"/var/lib/cni/networks","rangeſ":[]}}}`,
	`{"cniVersion":"1.1.0","name":"overlay","IPAM":{"dataDir":"/x"},"ipam":{}}`,
	`{"cniVersion":"9.9.9","name":"overlay"}`,
	`{"cniVersion":"1.1.0","name":"overlay","dataDir":"/a","dataDir":"/b"}`,
	`{"cniVersion":"1.1.0","name":"overlay"`, `null`, `[]`, ``, "\x00",
}

// hostileIDs are (container ID, interface name) pairs for the seeds.
var hostileIDs = [][2]string{
	{"c1", "eth0"},
	{"../../outside/secret", "eth0"}, {"c1", "../../outside"}, {"/etc/passwd", "eth0"}, {"c1", "/etc"},
	{"..", "eth0"}, {"c1", ".."}, {".", "eth0"}, {"c1", "."}, {"a\x00b", "eth0"}, {"c1", "eth\x000"},
	{`c1\..\x`, "eth0"}, {"c1", `\..`}, {"c1..x", "eth0"}, {"c1", "e..0"}, {"", "eth0"}, {"c1", ""},
	{"ünïcödé", "eth0"}, {"c1", "étһ0"}, {"c1", "eth 0"}, {"c1", "eth0:1"}, {"-", "-"}, {".hidden", "eth0"},
	{strings.Repeat("a", 300), "eth0"}, {"c1", "abcdefghijklmnop"},
	// File name 243 bytes: within NAME_MAX, but its temporary file's is not.
	{strings.Repeat("a", 230), "eth0"},
	{strings.Repeat("a", 227), "eth0"},
}

func addVerbSeeds(f *testing.F) {
	for i, conf := range hostileConfs {
		for v := range fuzzVerbs {
			id := hostileIDs[(i+v)%len(hostileIDs)]
			f.Add(uint8(v), []byte(conf), id[0], id[1], "", "IgnoreUnknown=1;K8S_POD_NAME=../../x", "/opt/cni/bin",
				uint8(i%10), uint8(0), uint8(0), uint8(flagPrepare|1), "/var/lib/cni/overlay", uint8(0))
		}
	}
	for i, id := range hostileIDs {
		for v := range fuzzVerbs {
			f.Add(uint8(v), []byte(hostileConfs[4]), id[0], id[1], "../../netns", "\x00", "../../",
				uint8(0), uint8(i%12), uint8(i%6), uint8(flagPrepare|uint8(i%8)), "/run/overlay/../../etc", uint8(0))
		}
	}
	// CHECK of a healthy attachment cached in each version, with a
	// prevResult the CNI library has to convert.
	for ver := range uint8(4) {
		for _, conf := range []string{hostileConfs[4], hostileConfs[5],
			`{"cniVersion":"1.0.0","name":"overlay","prevResult":{"cniVersion":"1.0.0","interfaces":[null,{"name":"eth0"}],"ips":[{"address":"10.244.7.2/24","interface":7}],"routes":[{"dst":"0.0.0.0/0"}]}}`,
			`{"cniVersion":"0.4.0","name":"overlay","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],"ips":[null]}}`,
		} {
			f.Add(uint8(2), []byte(conf), "c1", "eth0", "", "", "/opt/cni/bin",
				uint8(0), uint8(0), uint8(0), flagPrepare|1|ver<<6, "", uint8(0))
		}
	}
	// Every odd file as dataDir, subnetFile, ipam.dataDir and netns; failing delegates.
	for sel := range uint8(12) {
		f.Add(uint8(sel%5), []byte(hostileConfs[6]), "c1", "eth0", "", "", "/opt/cni/bin",
			sel, sel, sel, sel|flagPrepare, "relative/dir", sel)
		f.Add(uint8(4), []byte(hostileConfs[6]), "c1", "eth0", "", "", "/opt/cni/bin",
			sel, sel, uint8(0), uint8(flagPrepare), "/var/lib/cni/overlay", uint8(0))
		f.Add(uint8(sel%5), []byte(hostileConfs[0]), "c1", "eth0", "", "", "",
			sel, uint8(0), uint8(0), uint8(flagPrepare|flagHostileLock|flagOverride)|sel, "/"+strings.Repeat("d", 300), uint8(0x3f))
	}
}

// FuzzVerbs feeds arbitrary network configurations and CNI_* values to
// ADD, DEL, CHECK, STATUS and GC (fake delegate) in a sandbox. Invariants:
// no panic; success or a *types.Error with one of our codes (stdout empty
// on error); nothing changed in the sandbox but what cnifuzz.Policy allows
// (the cache entry named by network, container ID and interface name
// directly in dataDir; GC: entries of the network in dataDir and
// reservations in host-local's directory) and no paths outside it named;
// the delegate only run as a plain plugin name with a configuration of the
// network; invalid IDs, netns or configuration refused before anything is
// done; DEL never fails while the delegate succeeds; ADD and STATUS
// succeed when everything is in order.
func FuzzVerbs(f *testing.F) {
	addVerbSeeds(f)
	f.Fuzz(func(t *testing.T, verb uint8, stdin []byte, cid, ifname, netns, cniArgs, cniPath string,
		dataDir, subnetFile, ipam, flags uint8, free string, fail uint8) {
		verbCase{
			Verb: verb, Stdin: stdin, ContainerID: cid, IfName: ifname, NetNS: netns, Args: cniArgs, Path: cniPath,
			DataDir: dataDir, SubnetFile: subnetFile, IPAM: ipam, Flags: flags, Free: free, Fail: fail,
		}.run(t)
	})
}

// corruptKinds are what FuzzCorruptCache puts where the entry belongs.
const (
	kindFile    = iota // a regular file with the data
	kindSymlink        // a link to a file with the data in the decoy
	kindFIFO           // a FIFO (the data is unused)
	kindDir            // an empty directory
	kindNone           // nothing
	numKinds
)

// corruptCase is one input of FuzzCorruptCache.
type corruptCase struct {
	Data  []byte
	Kind  uint8 // corruptKinds, modulo
	Env   uint8 // 0 valid subnet.env, 1 missing, 2 garbage, 3 other lease
	Flags uint8 // bit 0: c1/eth0 is in GC's valid list; bit 1: the delegate fails
}

// run writes the data as the cache entry of overlay/c1/eth0 and runs CHECK,
// GC and DEL on it, each on the same damaged entry.
func (cc corruptCase) run(t *testing.T) {
	t.Helper()
	sb := cnifuzz.New(t)
	dataDir, hlDir := sb.Path(cnifuzz.DataDir), sb.Path(cnifuzz.IPAMDir+"/overlay")
	att := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	cache := Cache{Dir: dataDir}
	entry, _ := cache.Path(att)
	sb.PrepareHostLocal(hlDir, false)
	// A healthy entry of a stale attachment, and one of a network whose
	// name starts like ours: GC deletes the first, never the second.
	goodConf := func(version string) *NetConf {
		c, err := ParseConf([]byte(fmt.Sprintf(`{"cniVersion":%q,"name":"overlay","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q}}`,
			version, sb.Path(cnifuzz.EnvFile), dataDir, sb.Path(cnifuzz.IPAMDir))))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := goodConf("1.1.0")
	env := subnet.NewEnv(cnifuzz.Network, cnifuzz.Lease, 1450, true)
	rendered, err := Render(c, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Write(Attachment{Network: "overlay", ContainerID: "stale", IfName: "eth0"}, rendered); err != nil {
		t.Fatal(err)
	}
	v2 := *c
	v2.Name = "overlay-v2"
	r2, _ := Render(&v2, env)
	if err := cache.Write(Attachment{Network: "overlay-v2", ContainerID: "c3", IfName: "eth0"}, r2); err != nil {
		t.Fatal(err)
	}
	envGood := true
	switch cc.Env % 4 {
	case 1:
		envGood = false
		if err := os.Remove(sb.Path(cnifuzz.EnvFile)); err != nil {
			t.Fatal(err)
		}
	case 2:
		envGood = false
		if err := os.WriteFile(sb.Path(cnifuzz.EnvFile), []byte("OVERLAY_SUBNET=garbage\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	case 3:
		env = subnet.NewEnv(cnifuzz.Network, netip.MustParsePrefix("10.244.9.0/24"), 1450, true)
		if err := os.WriteFile(sb.Path(cnifuzz.EnvFile), env.Marshal(), 0o644); err != nil {
			t.Fatal(err)
		}
		if rendered, err = Render(c, env); err != nil {
			t.Fatal(err)
		}
	}
	kind := int(cc.Kind) % numKinds
	place := func() {
		t.Helper()
		_ = os.RemoveAll(entry)
		var err error
		switch kind {
		case kindFile:
			err = os.WriteFile(entry, cc.Data, 0o600)
		case kindSymlink:
			target := sb.Path(cnifuzz.Outside + "/victim")
			if err = os.WriteFile(target, cc.Data, 0o600); err == nil {
				err = os.Symlink(target, entry)
			}
		case kindFIFO:
			err = syscall.Mkfifo(entry, 0o600)
		case kindDir:
			err = os.Mkdir(entry, 0o700)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	prev := `"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/c1"}],"ips":[{"address":"10.244.7.2/24","interface":0}]}`
	valid := `"cni.dev/valid-attachments":[{"containerID":"other","ifname":"eth0"}]`
	if cc.Flags&1 != 0 {
		valid = `"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]`
	}
	confWith := func(extra string) []byte {
		if extra != "" {
			extra = "," + extra
		}
		return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"overlay","subnetFile":%q,"dataDir":%q,"ipam":{"dataDir":%q}%s}`,
			sb.Path(cnifuzz.EnvFile), dataDir, sb.Path(cnifuzz.IPAMDir), extra))
	}
	delegateFails := cc.Flags&2 != 0

	// runVerb places the damaged entry and runs verb; it returns the verb's
	// outcome, the fake delegate, the changes, and what Read made of the
	// entry just before.
	type outcome struct {
		err     error
		inv     *fakeInvoker
		changes []cnifuzz.Change
		entry   Entry
		readErr error
	}
	runVerb := func(verb string, extra string) outcome {
		t.Helper()
		place()
		e, rerr := cache.Read(att)
		// GC's List and DEL's Read agree on what a regular file is.
		if kind == kindFile {
			listed, err := cache.List("overlay")
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(listed, func(l Listed) bool { return l.Path == entry })
			switch {
			case i < 0:
				t.Fatalf("List does not return %s (Read: %v)", entry, rerr)
			case (rerr == nil) != (listed[i].Err == nil):
				t.Fatalf("Read says %v, List says %v", rerr, listed[i].Err)
			case rerr == nil && listed[i].Entry.Attachment != e.Attachment:
				t.Fatalf("Read gives %s, List %s", e.Attachment, listed[i].Entry.Attachment)
			}
		}
		before := sb.Snapshot(t)
		inv := &fakeInvoker{errs: map[string]error{}}
		if delegateFails {
			inv.errs["DEL"] = types.NewError(types.ErrTryAgainLater, "busy", "")
		}
		p := New(inv, &bytes.Buffer{}, &bytes.Buffer{})
		standIn := sb.Path(cnifuzz.NetNS)
		p.netns = acceptStandIns(func(path string) bool { return path == standIn })
		err := p.verb(verb)(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: standIn, Path: "/opt/cni/bin", StdinData: confWith(extra)})
		changes := cnifuzz.Diff(before, sb.Snapshot(t))
		if perr := (cnifuzz.Policy{Verb: verb, DataDir: dataDir, HostLocalDir: hlDir, Network: "overlay", ContainerID: "c1", IfName: "eth0"}).Check(changes); perr != nil {
			t.Fatal(perr)
		}
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || !slices.Contains(codesOfOurs, te.Code) {
				t.Fatalf("%s returned %T %v", verb, err, err)
			}
		}
		return outcome{err, inv, changes, e, rerr}
	}
	changed := func(changes []cnifuzz.Change, p string) bool {
		return slices.ContainsFunc(changes, func(c cnifuzz.Change) bool { return c.Path == p })
	}

	// CHECK: never changes anything; a corrupt entry is code 102.
	o := runVerb("CHECK", prev)
	err, rerr := o.err, o.readErr
	switch {
	case errors.Is(rerr, ErrCacheCorrupt):
		wantCodeOf(t, "CHECK", err, CodeCacheCorrupt)
	case errors.Is(rerr, fs.ErrNotExist):
		wantCodeOf(t, "CHECK", err, CodeNoCache)
	case rerr != nil:
		wantCodeOf(t, "CHECK", err, types.ErrIOFailure)
	}

	// GC with c1/eth0 not valid: a usable entry is deleted through the
	// delegate and removed; a corrupt regular file is removed; links,
	// FIFOs and directories are left alone. With c1/eth0 valid: untouched.
	o = runVerb("GC", valid)
	err, inv, changes, e, rerr := o.err, o.inv, o.changes, o.entry, o.readErr
	var delsOfC1 []call
	for _, cl := range inv.calls {
		if cl.Verb == "DEL" && cl.RT.ContainerID == "c1" {
			delsOfC1 = append(delsOfC1, cl)
		}
	}
	switch {
	case cc.Flags&1 != 0 || kind != kindFile:
		if len(delsOfC1) != 0 || changed(changes, entry) {
			t.Fatalf("GC touched the entry of c1/eth0 (valid %v, kind %d): DELs %v, changes %v", cc.Flags&1 != 0, kind, delsOfC1, changes)
		}
	case rerr == nil:
		if len(delsOfC1) != 1 || delsOfC1[0].Conf != string(e.Delegate.Config) || delsOfC1[0].RT.NetNS != "" {
			t.Fatalf("GC of a usable stale entry: DELs %+v, want one with the cached configuration and no netns", delsOfC1)
		}
		if exists(entry) != delegateFails { // removed only if the DEL succeeded
			t.Fatalf("GC: the delegate's DEL failed: %v; the entry is still there: %v", delegateFails, exists(entry))
		}
	default:
		if len(delsOfC1) != 0 || exists(entry) {
			t.Fatalf("GC of a corrupt entry (%v): DELs %v, entry still there %v; want it removed without a DEL", rerr, delsOfC1, exists(entry))
		}
	}
	if !exists(filepath.Join(dataDir, "overlay-v2-c3-eth0")) {
		t.Fatal("GC of overlay removed an entry of overlay-v2")
	}
	if (err != nil) != delegateFails {
		t.Fatalf("GC: %v (delegate fails: %v)", err, delegateFails)
	}

	// DEL: a usable entry is replayed; otherwise the configuration is
	// re-rendered from subnet.env and the delegate's DEL still runs (then
	// the unusable entry goes); with neither there is nothing to release.
	o = runVerb("DEL", "")
	err, inv, e, rerr = o.err, o.inv, o.entry, o.readErr
	var wantConf string
	switch {
	case rerr == nil:
		wantConf = string(e.Delegate.Config)
	case envGood:
		wantConf = string(rendered.Config)
	}
	switch {
	case wantConf == "":
		if err != nil || len(inv.calls) != 0 {
			t.Fatalf("DEL with no usable entry (%v) and no subnet.env: %v, calls %v; want success and nothing", rerr, err, inv.verbs())
		}
	case len(inv.calls) != 1 || inv.calls[0].Verb != "DEL" || inv.calls[0].Conf != wantConf:
		t.Fatalf("DEL (entry: %v): delegate calls %+v, want one DEL with\n%s", rerr, inv.calls, wantConf)
	case delegateFails:
		if err == nil || (kind != kindNone && !existsL(entry)) {
			t.Fatalf("DEL whose delegate fails: %v, entry there: %v; want the error and the entry kept", err, existsL(entry))
		}
	default:
		if err != nil || existsL(entry) {
			t.Fatalf("DEL: %v, entry still there: %v; want success and the entry gone", err, existsL(entry))
		}
	}
}

func existsL(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func wantCodeOf(t *testing.T, verb string, err error, code uint) {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) || te.Code != code {
		t.Fatalf("%s = %v, want code %d", verb, err, code)
	}
}

// corruptSeeds are damaged versions of a healthy entry of overlay/c1/eth0.
func corruptSeeds(tb testing.TB) [][]byte {
	dir := tb.TempDir()
	c, err := ParseConf([]byte(`{"cniVersion":"0.4.0","name":"overlay","delegate":{"hairpinMode":true}}`))
	if err != nil {
		tb.Fatal(err)
	}
	d, err := Render(c, subnet.NewEnv(cnifuzz.Network, cnifuzz.Lease, 1450, true))
	if err != nil {
		tb.Fatal(err)
	}
	cache := Cache{Dir: dir}
	att := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	if err := cache.Write(att, d); err != nil {
		tb.Fatal(err)
	}
	p, _ := cache.Path(att)
	good, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	s := string(good)
	seeds := [][]byte{good, nil, []byte("null"), []byte("{}"), []byte("[]"), []byte("\x00\xff"), []byte(" \n")}
	for _, r := range [][2]string{
		{`"format":1`, `"format":2`}, {`"format":1`, `"format":1.5`}, {`"containerID":"c1"`, `"containerID":"c2"`},
		{`"containerID":"c1"`, `"containerID":"../../outside/secret"`}, {`"ifName":"eth0"`, `"ifName":"../x"`},
		{`"network":"overlay"`, `"network":"other"`}, {`"lease":"10.244.7.0/24"`, `"lease":"10.244.9.0/24"`},
		{`"lease":"10.244.7.0/24"`, `"lease":"::/0"`}, {`"type":"bridge"`, `"type":"/bin/sh"`},
		{`"cniVersion":"0.4.0"`, `"cniVersion":"9.9.9"`}, {`"cniVersion":"0.4.0"`, `"cniVersion":1`},
		{`"name":"overlay",`, `"name":"other",`}, {`"config":{`, `"config":null,"x":{`},
	} {
		seeds = append(seeds, []byte(strings.Replace(s, r[0], r[1], 1)))
	}
	// A healthy entry of network overlay-x in overlay's file name.
	other := strings.Replace(strings.Replace(s, `"network":"overlay"`, `"network":"overlay-x"`, 1), `"name":"overlay",`, `"name":"overlay-x",`, 1)
	seeds = append(seeds, []byte(other))
	for i := 1; i < len(good); i += len(good)/9 + 1 {
		seeds = append(seeds, good[:i])
	}
	return seeds
}

// FuzzCorruptCache writes arbitrary bytes (or a link, FIFO or directory)
// where the cache entry of overlay/c1/eth0 belongs and runs CHECK, GC and
// DEL. Invariants: no panic, no hang; success or a CNI error; the sandbox
// changes only as cnifuzz.Policy allows (in particular, a link's target in
// the decoy is never written or removed); Read and GC's List agree on a
// regular file; CHECK answers 102 for a corrupt entry; GC deletes a usable
// stale entry through the delegate and removes a corrupt one; DEL always
// releases: the cached configuration when it is usable, else the one
// re-rendered from subnet.env, and succeeds when the delegate does.
func FuzzCorruptCache(f *testing.F) {
	for i, seed := range corruptSeeds(f) {
		f.Add(seed, uint8(i%numKinds), uint8(i%4), uint8(i%4))
		f.Add(seed, uint8(kindFile), uint8(0), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, kind, env, flags uint8) {
		corruptCase{Data: data, Kind: kind, Env: env, Flags: flags}.run(t)
	})
}
