package delegate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// Hostile inputs found while fuzzing (fuzz_test.go), checked on every run.
// Most cases go through verbCase.run, which also checks every invariant of
// FuzzVerbs (nothing written outside what cnifuzz.Policy allows, the codes,
// the delegate calls).

// codeOf returns the CNI error code of err, 0 for success.
func codeOf(t *testing.T, err error) uint {
	t.Helper()
	if err == nil {
		return 0
	}
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("%v (%T) is not a CNI error", err, err)
	}
	return te.Code
}

// within runs f and crashes the test binary if it has not returned in time
// (a FIFO opened for reading blocks until a writer comes): a hang is
// reported as the failure it is instead of as the package's timeout.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	timer := time.AfterFunc(testenv.Deadline(testenv.Slack), func() { panic(t.Name() + ": " + what + " hangs") })
	defer timer.Stop()
	f()
}

const prevResult110 = `"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.244.7.2/24","interface":0}]}`

// TestHostileAttachments: container IDs and interface names that could
// leave dataDir are refused with code 4 before anything is done; the
// longest accepted ones work (regression: names of 240 to 255 bytes were
// accepted, but the cache's temporary file name then exceeded NAME_MAX and
// every ADD failed with code 5).
func TestHostileAttachments(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"overlay",` + prevResult110 + `}`)
	longest := strings.Repeat("a", maxFileName-len("overlay--eth0"))
	for _, tc := range []struct {
		name, cid, ifname string
		code              uint
	}{
		{"plain", "c1", "eth0", 0},
		{"longest name", longest, "eth0", 0},
		{"name one byte too long", longest + "a", "eth0", types.ErrInvalidEnvironmentVariables},
		{"name 243 bytes", strings.Repeat("a", 230), "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID traversal", "../../outside/secret", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID absolute", "/etc/passwd", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID dot dot", "..", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID dot", ".", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID hidden", ".overlay-c1-eth0.tmp-1", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID backslash", `c1\..\x`, "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID NUL", "c1\x00/../x", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID unicode", "ünïcödé", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID empty", "", "eth0", types.ErrInvalidEnvironmentVariables},
		{"ID very long", strings.Repeat("a", 4096), "eth0", types.ErrInvalidEnvironmentVariables},
		{"ifname traversal", "c1", "../../x", types.ErrInvalidEnvironmentVariables},
		{"ifname absolute", "c1", "/etc", types.ErrInvalidEnvironmentVariables},
		{"ifname dot dot", "c1", "..", types.ErrInvalidEnvironmentVariables},
		{"ifname dots inside", "c1", "e..0", types.ErrInvalidEnvironmentVariables},
		{"ifname backslash", "c1", `\..`, types.ErrInvalidEnvironmentVariables},
		{"ifname NUL", "c1", "eth\x000", types.ErrInvalidEnvironmentVariables},
		{"ifname too long", "c1", "abcdefghijklmnop", types.ErrInvalidEnvironmentVariables},
		{"ifname colon", "c1", "eth0:1", types.ErrInvalidEnvironmentVariables},
		{"ifname space", "c1", "eth 0", types.ErrInvalidEnvironmentVariables},
		{"ifname unicode (allowed)", "c1", "étһ0", 0},
	} {
		for v, verb := range fuzzVerbs[:3] {
			t.Run(tc.name+" "+verb, func(t *testing.T) {
				err := verbCase{Verb: uint8(v), Stdin: conf, ContainerID: tc.cid, IfName: tc.ifname,
					Path: "/opt/cni/bin", Flags: prepareFor(verb) | 1}.run(t)
				if got := codeOf(t, err); got != tc.code {
					t.Fatalf("%s = %v, want code %d", verb, err, tc.code)
				}
			})
		}
	}
}

// TestHostileNetNS: a CNI_NETNS that is a FIFO or a device is refused
// before anything is done (regression: the CNI library opens it after a
// successful ADD or DEL, and a FIFO blocked the plugin forever); ADD and
// CHECK also refuse an empty or missing one and one that is no network
// namespace (a directory, a regular file), while DEL passes those on (a
// pod whose namespace is gone must still release its address); every verb
// in the plugin's own namespace is refused before anything is cached or
// delegated (regressions: the library refused an ADD only after it ran,
// whose result was already on stdout, so stdout held a result and then an
// error; and a DEL only after bridge had deleted the host's interface named
// CNI_IFNAME).
func TestHostileNetNS(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"overlay",` + prevResult110 + `}`)
	for _, tc := range []struct {
		name     string
		sel      uint8 // cnifuzz.NetNSValue
		override bool
		codes    [3]uint // ADD, DEL, CHECK
	}{
		{"empty", 0, false, [3]uint{4, 0, 4}},
		{"the stand-in for a namespace", 1, false, [3]uint{0, 0, 0}},
		{"FIFO", 2, false, [3]uint{4, 4, 4}},
		{"FIFO with override", 2, true, [3]uint{4, 4, 4}},
		{"own namespace", 3, false, [3]uint{types.ErrInvalidNetNS, types.ErrInvalidNetNS, types.ErrInvalidNetNS}},
		{"own namespace with override", 3, true, [3]uint{0, 0, 0}},
		{"/dev/zero", 4, false, [3]uint{4, 4, 4}},
		{"directory", 5, false, [3]uint{4, 0, 4}},
		{"traversal to a regular file", 6, false, [3]uint{4, 0, 4}},
		{"missing", 7, false, [3]uint{4, 0, 4}},
	} {
		for v, verb := range fuzzVerbs[:3] {
			t.Run(tc.name+" "+verb, func(t *testing.T) {
				flags := prepareFor(verb) | tc.sel
				if tc.override {
					flags |= flagOverride
				}
				var err error
				within(t, verb, func() {
					err = verbCase{Verb: uint8(v), Stdin: conf, ContainerID: "c1", IfName: "eth0", Flags: flags}.run(t)
				})
				if got := codeOf(t, err); got != tc.codes[v] {
					t.Fatalf("%s = %v, want code %d", verb, err, tc.codes[v])
				}
			})
		}
	}
}

// TestHostileConfigPaths: dataDir and subnetFile naming odd files give the
// documented codes, never a hang, never a write elsewhere (regression:
// subnetFile pointing at a FIFO blocked forever, at /dev/zero read until
// memory ran out).
func TestHostileConfigPaths(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"overlay","cni.dev/valid-attachments":[]}`)
	for _, tc := range []struct {
		name                 string
		dataDir, envFile     uint8 // cnifuzz selectors
		free                 string
		add, del, status, gc uint
	}{
		{name: "dataDir is a file", dataDir: 3, add: 5, gc: 104},
		{name: "dataDir is a FIFO", dataDir: 4, add: 5, gc: 104},
		{name: "dataDir is a dangling link into the decoy", dataDir: 5, add: 5},
		{name: "dataDir is dev-zero", dataDir: 6, add: 5, gc: 104},
		{name: "dataDir with dot dot", dataDir: 7},
		{name: "dataDir relative", dataDir: 8, free: "../../var/lib/cni", add: 7, del: 7, status: 7, gc: 7},
		{name: "dataDir empty", dataDir: 8, free: "", add: 7, del: 7, status: 7, gc: 7},
		{name: "dataDir with NUL", dataDir: 8, free: "/x\x00/y", add: 7, del: 7, status: 7, gc: 7},
		{name: "dataDir not a string", dataDir: 9, add: 7, del: 7, status: 7, gc: 7},
		{name: "dataDir absolute elsewhere (re-rooted)", dataDir: 8, free: "/var/lib/cni/overlay"},
		{name: "dataDir too long", dataDir: 8, free: "/" + strings.Repeat("d", 300), add: 5},
		{name: "subnetFile missing", envFile: 1, add: 11, status: 50},
		{name: "subnetFile is a directory", envFile: 2, add: 11, status: 50},
		{name: "subnetFile empty", envFile: 3, add: 11, status: 50},
		{name: "subnetFile garbage", envFile: 4, add: 11, status: 50},
		{name: "subnetFile is a FIFO", envFile: 5, add: 11, status: 50},
		{name: "subnetFile is dev-zero", envFile: 6, add: 11, status: 50},
		{name: "subnetFile too large", envFile: 7, add: 11, status: 50},
		{name: "subnetFile is a decoy passwd", envFile: 8, add: 11, status: 50},
		{name: "subnetFile dangling link", envFile: 9, add: 11, status: 50},
		{name: "subnetFile relative", envFile: 10, free: "subnet.env", add: 7, del: 7, status: 7, gc: 7},
	} {
		for _, verb := range []string{"ADD", "DEL", "STATUS", "GC"} {
			want := map[string]uint{"ADD": tc.add, "DEL": tc.del, "STATUS": tc.status, "GC": tc.gc}[verb]
			t.Run(tc.name+" "+verb, func(t *testing.T) {
				var err error
				within(t, verb, func() {
					err = verbCase{Verb: uint8(indexOf(fuzzVerbs, verb)), Stdin: conf, ContainerID: "c1", IfName: "eth0",
						DataDir: tc.dataDir, SubnetFile: tc.envFile, Free: tc.free, Flags: prepareFor(verb) | 1}.run(t) // 1: the stand-in namespace
				})
				if got := codeOf(t, err); got != want {
					t.Fatalf("%s = %v, want code %d", verb, err, want)
				}
			})
		}
	}
}

// prepareFor is flagPrepare (the attachment is cached before the verb)
// except for ADD, which refuses an attachment that is cached already
// (TestAddRefusesExisting).
func prepareFor(verb string) uint8 {
	if verb == "ADD" {
		return 0
	}
	return flagPrepare
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// TestHostileHostLocalLock: GC never follows a link named lock in
// host-local's directory (regression: a dangling one made GC create its
// target, anywhere).
func TestHostileHostLocalLock(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"overlay","cni.dev/valid-attachments":[]}`)
	err := verbCase{Verb: uint8(indexOf(fuzzVerbs, "GC")), Stdin: conf, Flags: flagHostileLock}.run(t)
	if got := codeOf(t, err); got != CodeGCIncomplete {
		t.Fatalf("GC = %v, want code %d", err, CodeGCIncomplete)
	}
}

// TestConfRejectsKeyAliases: the delegates read their configuration with
// encoding/json, which matches keys ignoring case and keeps the last; since
// Render sorts keys, an alias of a key overlay-cni sets could override it
// (regression: "cniversion" replaced cniVersion, "rangeſ" the lease,
// "datadir" moved host-local's reservations away from what GC sweeps).
func TestConfRejectsKeyAliases(t *testing.T) {
	for _, conf := range []string{
		`{"cniVersion":"1.1.0","name":"n","delegate":{"cniversion":"0.1.0"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"CNIVERSION":"0.1.0"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"Name":"other"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"Type":"macvlan"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"IPAM":{"type":"dhcp"}}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"prevresult":{}}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"runtimeconfig":{}}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"Args":{}}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"MTU":9000}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"ipmasq":true}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"Bridge":"br1"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"isgateway":false}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"datadir":"/var/lib/elsewhere"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"DataDir":"/var/lib/elsewhere"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"dataDir":"/a","DATADIR":"/b"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"rangeſ":[[{"subnet":"192.0.2.0/24"}]]}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"Ranges":[]}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"ROUTES":[]}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"Type":"dhcp"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"ſubnet":"192.0.2.0/24"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"RangeStart":"10.244.7.10"}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":{"ipam":{"Gateway":"10.244.7.9"}}}`,
	} {
		t.Run(conf, func(t *testing.T) {
			if _, err := ParseConf([]byte(conf)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "letter case") {
				t.Fatalf("ParseConf = %v, want the alias refused", err)
			}
		})
	}
	// The exact keys are fine, and so are the reserved prefix's aliases,
	// which are dropped like the prefix itself.
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"n","delegate":{"cniVersion":"0.1.0","name":"x","mtu":1400,"hairpinMode":true,"hairpinmode":true,"CNI.dev/valid-attachments":[]},"ipam":{"dataDir":"/hl","subnet":"1.2.3.0/24","resolvConf":"/etc/resolv.conf"}}`))
	if err != nil {
		t.Fatalf("ParseConf: %v", err)
	}
	d, err := Render(c, testEnv(true))
	if err != nil {
		t.Fatal(err)
	}
	var seen struct {
		CNIVersion string `json:"cniVersion"`
		MTU        int    `json:"mtu"`
		IPAM       struct {
			DataDir string `json:"dataDir"`
			Ranges  [][]struct {
				Subnet string `json:"subnet"`
			} `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(d.Config, &seen); err != nil {
		t.Fatal(err)
	}
	if seen.CNIVersion != "1.1.0" || seen.MTU != 1400 || seen.IPAM.DataDir != "/hl" || len(seen.IPAM.Ranges) != 1 ||
		seen.IPAM.Ranges[0][0].Subnet != "10.244.7.0/24" || strings.Contains(string(d.Config), "CNI.dev") {
		t.Errorf("the delegate would read %+v from %s", seen, d.Config)
	}
}

// TestCheckPrevResultWithNulls: a prevResult with null entries is a
// decoding failure (code 6), in whatever version the attachment was cached
// (regression: converting it to the cached version, e.g. 0.4.0, crashed the
// plugin with a nil pointer dereference inside the CNI library).
func TestCheckPrevResultWithNulls(t *testing.T) {
	for _, prev := range []string{
		`{"cniVersion":"1.1.0","ips":[null]}`,
		`{"cniVersion":"1.1.0","interfaces":[null]}`,
		`{"cniVersion":"1.1.0","routes":[null]}`,
		`{"cniVersion":"1.1.0","IPS":[null]}`,
		`{"cniVersion":"1.1.0","interfaces":[null,{"name":"eth0"}],"ips":[{"address":"10.244.7.2/24","interface":7}]}`,
	} {
		for ver := range uint8(len(cachedVersions)) {
			t.Run(fmt.Sprintf("%s cached %s", prev, cachedVersions[ver]), func(t *testing.T) {
				conf := []byte(`{"cniVersion":"1.1.0","name":"overlay","prevResult":` + prev + `}`)
				err := verbCase{Verb: uint8(indexOf(fuzzVerbs, "CHECK")), Stdin: conf, ContainerID: "c1", IfName: "eth0",
					Flags: flagPrepare | ver<<6 | 1}.run(t) // 1: the stand-in namespace
				if got := codeOf(t, err); got != types.ErrDecodingFailure {
					t.Fatalf("CHECK = %v, want code %d", err, types.ErrDecodingFailure)
				}
			})
		}
	}
	if _, err := decodeResult([]byte(`{"cniVersion":"1.1.0"}`), []byte(`{"cniVersion":"1.1.0","ips":[null]}`)); err == nil {
		t.Error("decodeResult accepted a delegate result with a null IP")
	}
}

// TestHostileCacheEntries: what lies where an entry belongs is only ever
// read if it is a regular file; a FIFO, a link or a directory is a corrupt
// entry (regression: a FIFO blocked DEL and CHECK forever), and DEL removes
// the link, never its target.
func TestHostileCacheEntries(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind uint8
	}{{"FIFO", kindFIFO}, {"link", kindSymlink}, {"directory", kindDir}} {
		t.Run(tc.name, func(t *testing.T) {
			within(t, "CHECK, GC and DEL", func() {
				corruptCase{Data: []byte("{}"), Kind: tc.kind}.run(t)
			})
		})
	}
	t.Run("Read", func(t *testing.T) {
		dir := t.TempDir()
		c := Cache{Dir: dir}
		att := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
		if err := c.Write(att, testDelegate(t, "overlay")); err != nil {
			t.Fatal(err)
		}
		p, _ := c.Path(att)
		good := filepath.Join(dir, "good")
		if err := os.Rename(p, good); err != nil {
			t.Fatal(err)
		}
		for name, mk := range map[string]func() error{
			"link to a good entry": func() error { return os.Symlink(good, p) },
			"FIFO":                 func() error { return syscall.Mkfifo(p, 0o600) },
			"directory":            func() error { return os.Mkdir(p, 0o700) },
			"link to dev-zero":     func() error { return os.Symlink("/dev/zero", p) },
		} {
			_ = os.RemoveAll(p)
			if err := mk(); err != nil {
				t.Fatal(err)
			}
			within(t, "Read", func() {
				if _, err := c.Read(att); !errors.Is(err, ErrCacheCorrupt) {
					t.Errorf("%s: Read = %v, want ErrCacheCorrupt", name, err)
				}
			})
		}
	})
}

// TestCacheListFileOfAnotherNetwork: a file named as overlay's entry but
// holding an entry of another network is corrupt for GC as it is for DEL
// (regression: List skipped it as the other network's, so GC never removed
// it while DEL did).
func TestCacheListFileOfAnotherNetwork(t *testing.T) {
	fx := newFixture(t)
	other := Cache{Dir: t.TempDir()}
	if err := other.Write(Attachment{Network: "overlay-x", ContainerID: "c1", IfName: "eth0"}, testDelegate(t, "overlay-x")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(other.Dir, "overlay-x-c1-eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(fx.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fx.cacheFile("c1", "eth0"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	listed, err := Cache{Dir: fx.dataDir}.List("overlay")
	if err != nil || len(listed) != 1 || !errors.Is(listed[0].Err, ErrCacheCorrupt) {
		t.Fatalf("List = %+v, %v; want the file as a corrupt entry", listed, err)
	}
	if err := fx.plugin.GC(&skel.CmdArgs{StdinData: fx.conf("1.1.0", `"cni.dev/valid-attachments":[]`)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if exists(fx.cacheFile("c1", "eth0")) {
		t.Error("GC left the corrupt entry of an invalid attachment")
	}
}
