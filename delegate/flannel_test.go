package delegate

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

// flannelEntry is byte for byte what flannel's CNI plugin (v1.x,
// flannel_linux.go doCmdAdd and flannel.go delegateAdd) writes to
// <dataDir>/<containerID> for kube-flannel's conflist ({"name":"cbr0",
// "cniVersion":"0.3.1", delegate {"hairpinMode":true,
// "isDefaultGateway":true}}) and flanneld's subnet.env
// FLANNEL_NETWORK=10.244.0.0/16, FLANNEL_SUBNET=10.244.7.1/24,
// FLANNEL_MTU=1450, FLANNEL_IPMASQ=true: the delegate map marshalled by
// encoding/json (keys sorted, compact), the lease as a network address.
const flannelEntry = `{"cniVersion":"0.3.1","hairpinMode":true,"ipMasq":false,` +
	`"ipam":{"ranges":[[{"subnet":"10.244.7.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},` +
	`"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"cbr0","type":"bridge"}`

// flannelDualStackEntry is the same on a dual-stack host.
const flannelDualStackEntry = `{"cniVersion":"0.3.1","ipMasq":false,` +
	`"ipam":{"ranges":[[{"subnet":"10.244.7.0/24"}],[{"subnet":"fd00:10:244:7::/64"}]],` +
	`"routes":[{"dst":"10.244.0.0/16"},{"dst":"fd00:10:244::/48"}],"type":"host-local"},` +
	`"isGateway":true,"mtu":1450,"name":"cbr0","type":"bridge"}`

func writeFlannelEntry(t *testing.T, dir, cid, content string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, cid)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFlannelCacheRead(t *testing.T) {
	dir := t.TempDir()
	c := FlannelCache{Dir: dir}
	writeFlannelEntry(t, dir, "c1", flannelEntry)
	writeFlannelEntry(t, dir, "c2", flannelDualStackEntry)

	att := Attachment{Network: "cbr0", ContainerID: "c1", IfName: "eth0"}
	e, err := c.Read(att)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	want := Entry{Attachment: att, Delegate: Delegate{Type: "bridge", Lease: netip.MustParsePrefix("10.244.7.0/24"), Config: []byte(flannelEntry)}}
	if e.Attachment != want.Attachment || e.Delegate.Type != want.Delegate.Type || e.Delegate.Lease != want.Delegate.Lease ||
		e.Delegate.IPv6Lease.IsValid() || string(e.Delegate.Config) != flannelEntry {
		t.Errorf("entry %+v (config %s), want %+v", e, e.Delegate.Config, want)
	}
	att2 := Attachment{Network: "cbr0", ContainerID: "c2", IfName: "net1"}
	if e, err := c.Read(att2); err != nil || e.Attachment != att2 || e.Delegate.Lease != netip.MustParsePrefix("10.244.7.0/24") ||
		e.Delegate.IPv6Lease != netip.MustParsePrefix("fd00:10:244:7::/64") {
		t.Errorf("dual-stack Read = %+v, %v", e, err)
	}

	if _, err := c.Read(Attachment{Network: "cbr0", ContainerID: "c3", IfName: "eth0"}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read(missing) = %v, want fs.ErrNotExist", err)
	}
	_, err = c.Read(Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"})
	if !errors.Is(err, ErrOtherNetwork) || !strings.Contains(err.Error(), `it is for network "cbr0", not "overlay"`) {
		t.Errorf("Read(another network) = %v, want ErrOtherNetwork naming both", err)
	}
	if err := c.Remove(att); err != nil || exists(filepath.Join(dir, "c1")) {
		t.Errorf("Remove: %v", err)
	}
	if err := c.Remove(att); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// Anything in a flannel cache file that is not what flannel writes is a
// corrupt entry, never a panic; nothing but the file itself is opened.
func TestFlannelCacheHostileEntries(t *testing.T) {
	replace := func(old, new string) string { return strings.Replace(flannelEntry, old, new, 1) }
	for name, content := range map[string]string{
		"empty":                   "",
		"blank":                   " \n\t",
		"truncated":               flannelEntry[:60],
		"not JSON":                "\x00\x01garbage",
		"null":                    "null",
		"an array":                "[" + flannelEntry + "]",
		"a string":                `"bridge"`,
		"no type":                 replace(`"type":"bridge"`, `"kind":"bridge"`),
		"type not a string":       replace(`"type":"bridge"`, `"type":7`),
		"type is a path":          replace(`"type":"bridge"`, `"type":"../../usr/bin/evil"`),
		"type is absolute":        replace(`"type":"bridge"`, `"type":"/bin/sh"`),
		"type with a space":       replace(`"type":"bridge"`, `"type":"bridge x"`),
		"no name":                 replace(`"name":"cbr0",`, ``),
		"name with a slash":       replace(`"name":"cbr0"`, `"name":"../cbr0"`),
		"name with dots":          replace(`"name":"cbr0"`, `"name":"a..b"`),
		"name not a string":       replace(`"name":"cbr0"`, `"name":{"x":1}`),
		"no ipam":                 replace(`"ipam"`, `"ipamx"`),
		"ipam not an object":      replace(`"ipam":{`, `"ipam":7,"x":{`),
		"no ranges":               replace(`"ranges"`, `"rangez"`),
		"empty range set":         replace(`[[{"subnet":"10.244.7.0/24"}]]`, `[[]]`),
		"no range sets":           replace(`[[{"subnet":"10.244.7.0/24"}]]`, `[]`),
		"ranges not a list":       replace(`[[{"subnet":"10.244.7.0/24"}]]`, `{"subnet":"10.244.7.0/24"}`),
		"subnet garbage":          replace(`10.244.7.0/24`, `eve`),
		"subnet not a cidr":       replace(`10.244.7.0/24`, `10.244.7.0`),
		"subnet IPv4-mapped":      replace(`10.244.7.0/24`, `::ffff:10.244.7.0/120`),
		"two IPv4 range sets":     replace(`[[{"subnet":"10.244.7.0/24"}]]`, `[[{"subnet":"10.244.7.0/24"}],[{"subnet":"10.244.8.0/24"}]]`),
		"subnet a number":         replace(`"10.244.7.0/24"`, `7`),
		"range set of nulls":      replace(`[[{"subnet":"10.244.7.0/24"}]]`, `[null]`),
		"deeply nested garbage":   strings.Repeat("[", 100000),
		"larger than the limit":   replace(`"mtu":1450`, `"mtu":1450,"pad":"`+strings.Repeat("x", maxCacheFile)+`"`),
		"duplicate type key last": replace(`"type":"bridge"}`, `"type":"bridge","type":"a/b"}`),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFlannelEntry(t, dir, "c1", content)
			within(t, "Read", func() {
				_, err := FlannelCache{Dir: dir}.Read(Attachment{Network: "cbr0", ContainerID: "c1", IfName: "eth0"})
				if !errors.Is(err, ErrCacheCorrupt) {
					t.Errorf("Read = %v, want ErrCacheCorrupt", err)
				}
			})
		})
	}
	t.Run("not a regular file", func(t *testing.T) {
		dir := t.TempDir()
		good := writeFlannelEntry(t, dir, "good", flannelEntry)
		p := filepath.Join(dir, "c1")
		for name, mk := range map[string]func() error{
			"link to a good entry": func() error { return os.Symlink(good, p) },
			"link to dev-zero":     func() error { return os.Symlink("/dev/zero", p) },
			"FIFO":                 func() error { return syscall.Mkfifo(p, 0o600) },
			"directory":            func() error { return os.Mkdir(p, 0o700) },
		} {
			_ = os.RemoveAll(p)
			if err := mk(); err != nil {
				t.Fatal(err)
			}
			within(t, name, func() {
				if _, err := (FlannelCache{Dir: dir}).Read(Attachment{Network: "cbr0", ContainerID: "c1", IfName: "eth0"}); !errors.Is(err, ErrCacheCorrupt) {
					t.Errorf("%s: Read = %v, want ErrCacheCorrupt", name, err)
				}
			})
		}
	})
	t.Run("container IDs that could escape", func(t *testing.T) {
		c := FlannelCache{Dir: t.TempDir()}
		for _, id := range []string{"", ".", "..", "../c1", "a/b", `a\b`, "c\x001", "-c1", ".hidden"} {
			if _, err := c.Path(id); !errors.Is(err, ErrInvalidAttachment) {
				t.Errorf("Path(%q) = %v, want ErrInvalidAttachment", id, err)
			}
		}
	})
}

// flannelFixture is a fixture whose network is named cbr0, as kube-flannel's
// conflist names it, with flannelDataDir set.
type flannelFixture struct {
	*fixture
	flannelDir string
}

func newFlannelFixture(t *testing.T) *flannelFixture {
	fx := &flannelFixture{fixture: newFixture(t), flannelDir: filepath.Join(t.TempDir(), "flannel")}
	return fx
}

func (fx *flannelFixture) conf(extra ...string) []byte {
	c := string(fx.fixture.conf("1.1.0", append([]string{`"flannelDataDir":"` + fx.flannelDir + `"`}, extra...)...))
	return []byte(strings.Replace(c, `"name":"overlay"`, `"name":"cbr0"`, 1))
}

func (fx *flannelFixture) entry(cid, content string) string {
	return writeFlannelEntry(fx.t, fx.flannelDir, cid, content)
}

func TestDelOfAPodFlannelAdded(t *testing.T) {
	t.Run("replays flannel's configuration and removes its entry", func(t *testing.T) {
		fx := newFlannelFixture(t)
		p := fx.entry("c1", flannelEntry)
		fx.writeEnv("10.244.9.0/24") // the lease changed since: the cached one is replayed all the same
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil {
			t.Fatalf("Del: %v", err)
		}
		want := []call{{Verb: "DEL", Plugin: "bridge", Conf: flannelEntry, RT: Runtime{ContainerID: "c1", NetNS: "/var/run/netns/c1", IfName: "eth0", Path: "/opt/cni/bin"}}}
		if diff := cmp.Diff(want, fx.inv.calls); diff != "" {
			t.Errorf("delegate calls (-want +got):\n%s", diff)
		}
		if exists(p) {
			t.Error("flannel's entry left after a successful DEL")
		}
		if !strings.Contains(fx.stderr.String(), "added by flannel's CNI plugin") {
			t.Errorf("stderr %q does not say where the configuration came from", fx.stderr)
		}
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil {
			t.Fatalf("second Del: %v", err)
		}
		if fx.inv.calls[1].Conf == flannelEntry {
			t.Error("the second DEL replayed flannel's entry again")
		}
	})
	t.Run("the cached type is the delegate", func(t *testing.T) {
		fx := newFlannelFixture(t)
		fx.entry("c1", strings.Replace(flannelEntry, `"type":"bridge"`, `"type":"ptp"`, 1))
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if got := fx.inv.calls[0].Plugin; got != "ptp" {
			t.Errorf("delegate %q, want flannel's cached type ptp", got)
		}
	})
	t.Run("delegate failure keeps the entry", func(t *testing.T) {
		fx := newFlannelFixture(t)
		p := fx.entry("c1", flannelEntry)
		fx.inv.errs["DEL"] = types.NewError(types.ErrIOFailure, "disk on fire", "")
		te := wantCode(t, fx.plugin.Del(fx.args("c1", "eth0", fx.conf())), types.ErrIOFailure)
		if !strings.Contains(te.Msg, "the cache entry is kept") || !exists(p) {
			t.Errorf("error %v, entry exists %v: want the entry kept for the retry", te, exists(p))
		}
		delete(fx.inv.errs, "DEL")
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil || exists(p) {
			t.Errorf("retried Del: %v, entry left %v", err, exists(p))
		}
	})
	for name, content := range map[string]string{
		"a corrupt entry":              flannelEntry[:40],
		"an empty entry":               "",
		"another network's":            strings.Replace(flannelEntry, `"name":"cbr0"`, `"name":"other"`, 1),
		"a path as type":               strings.Replace(flannelEntry, `"type":"bridge"`, `"type":"/bin/sh"`, 1),
		"a file that is not flannel's": "root:x:0:0:root:/root:/bin/bash\n",
	} {
		t.Run(name+" is left alone and DEL re-renders", func(t *testing.T) {
			fx := newFlannelFixture(t)
			p := fx.entry("c1", content)
			if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil {
				t.Fatalf("Del: %v", err)
			}
			if len(fx.inv.calls) != 1 || fx.inv.calls[0].Plugin != "bridge" || !strings.Contains(fx.inv.calls[0].Conf, `"name":"cbr0"`) ||
				!strings.Contains(fx.inv.calls[0].Conf, `"forceAddress":true`) {
				t.Errorf("delegate calls %+v, want one DEL with the configuration rendered from subnet.env", fx.inv.calls)
			}
			if got, err := os.ReadFile(p); err != nil || string(got) != content {
				t.Errorf("the file in flannel's cache was changed or removed: %q, %v", got, err)
			}
		})
	}
	t.Run("a corrupt entry without subnet.env: nothing to release, success", func(t *testing.T) {
		fx := newFlannelFixture(t)
		fx.entry("c1", "{")
		fx.removeEnv()
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil || len(fx.inv.calls) != 0 {
			t.Errorf("Del = %v, calls %+v", err, fx.inv.calls)
		}
	})
	t.Run("flannel's entry is used without subnet.env", func(t *testing.T) {
		fx := newFlannelFixture(t)
		fx.entry("c1", flannelEntry)
		fx.removeEnv()
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil || len(fx.inv.calls) != 1 || fx.inv.calls[0].Conf != flannelEntry {
			t.Errorf("Del = %v, calls %+v", err, fx.inv.calls)
		}
	})
	t.Run("overlay-cni's own entry comes first", func(t *testing.T) {
		fx := newFlannelFixture(t)
		if err := fx.plugin.Add(fx.args("c1", "eth0", fx.conf())); err != nil {
			t.Fatal(err)
		}
		p := fx.entry("c1", flannelEntry)
		if err := fx.plugin.Del(fx.args("c1", "eth0", fx.conf())); err != nil {
			t.Fatal(err)
		}
		if del := fx.inv.calls[1]; del.Conf != fx.inv.calls[0].Conf {
			t.Errorf("DEL replayed %s, want overlay-cni's own entry", del.Conf)
		}
		if !exists(p) {
			t.Error("flannel's entry removed by the DEL of overlay-cni's")
		}
	})
	t.Run("without flannelDataDir flannel's cache is not looked at", func(t *testing.T) {
		fx := newFlannelFixture(t)
		p := fx.entry("c1", flannelEntry)
		conf := strings.Replace(string(fx.conf()), `"flannelDataDir":"`+fx.flannelDir+`"`, `"flannelDataDir":""`, 1)
		if err := fx.plugin.Del(fx.args("c1", "eth0", []byte(conf))); err != nil {
			t.Fatal(err)
		}
		if fx.inv.calls[0].Conf == flannelEntry || !exists(p) {
			t.Errorf("flannel's entry was used: calls %+v", fx.inv.calls)
		}
	})
}

func TestCheckOfAPodFlannelAdded(t *testing.T) {
	// The runtime's result of the conflist's version (1.1.0); flannel's
	// configuration is 0.3.1, so the delegate gets it converted to that.
	prev := `"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/c1"}],"ips":[{"address":"10.244.7.2/24","gateway":"10.244.7.1","interface":0}]}`
	// bridge refuses to CHECK a 0.3.1 configuration (kube-flannel's):
	// CHECK raises it to the request's version; one of a version that has
	// CHECK is passed as it is, with the prevResult converted to it.
	for cached, want := range map[string]string{"0.3.1": "1.1.0", "0.4.0": "0.4.0", "1.0.0": "1.0.0"} {
		t.Run("checks with flannel's configuration at "+cached, func(t *testing.T) {
			fx := newFlannelFixture(t)
			entry := strings.Replace(flannelEntry, `"cniVersion":"0.3.1"`, `"cniVersion":"`+cached+`"`, 1)
			fx.entry("c1", entry)
			if err := fx.plugin.Check(fx.args("c1", "eth0", fx.conf(prev))); err != nil {
				t.Fatalf("Check: %v", err)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(fx.inv.calls[0].Conf), &got); err != nil {
				t.Fatal(err)
			}
			prevResult, _ := got["prevResult"].(map[string]any)
			delete(got, "prevResult")
			var wantConf map[string]any
			if err := json.Unmarshal([]byte(strings.Replace(entry, `"cniVersion":"`+cached+`"`, `"cniVersion":"`+want+`"`, 1)), &wantConf); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantConf, got); diff != "" || fx.inv.calls[0].Plugin != "bridge" || prevResult["cniVersion"] != want {
				t.Errorf("CHECK of %s with %s (-want +got):\n%s", fx.inv.calls[0].Plugin, fx.inv.calls[0].Conf, diff)
			}
		})
	}
	for name, tc := range map[string]struct {
		content string
		lease   string
		code    uint
	}{
		"lease changed": {flannelEntry, "10.244.9.0/24", CodeLeaseChanged},
		"corrupt":       {"{", "10.244.7.0/24", CodeCacheCorrupt},
		"other network": {strings.Replace(flannelEntry, `"name":"cbr0"`, `"name":"other"`, 1), "10.244.7.0/24", CodeNoCache},
	} {
		t.Run(name, func(t *testing.T) {
			fx := newFlannelFixture(t)
			fx.entry("c1", tc.content)
			fx.writeEnv(tc.lease)
			wantCode(t, fx.plugin.Check(fx.args("c1", "eth0", fx.conf(prev))), tc.code)
		})
	}
	t.Run("no entry anywhere", func(t *testing.T) {
		fx := newFlannelFixture(t)
		te := wantCode(t, fx.plugin.Check(fx.args("c1", "eth0", fx.conf(prev))), CodeNoCache)
		if !strings.Contains(te.Msg, "nor in flannel's "+fx.flannelDir) {
			t.Errorf("message %q does not name flannel's cache", te.Msg)
		}
	})
}

// GC keeps flannel's entries of valid containers and of other networks,
// and files it does not recognise; it removes this network's entries of
// stale containers, and host-local's sweep releases their addresses — but
// never the address of a valid attachment whose only entry is flannel's.
func TestGCWithFlannelEntries(t *testing.T) {
	fx := newFlannelFixture(t)
	fx.entry("keep", flannelEntry)
	fx.entry("stale", flannelEntry)
	fx.entry("other-net", strings.Replace(flannelEntry, `"name":"cbr0"`, `"name":"other"`, 1))
	fx.entry("corrupt", "{")
	fx.entry(".hidden", flannelEntry)
	if err := os.Symlink(filepath.Join(fx.flannelDir, "stale"), filepath.Join(fx.flannelDir, "link")); err != nil {
		t.Fatal(err)
	}
	writeHostLocal(t, filepath.Join(fx.ipamDir, "cbr0"), map[string]string{
		"lock": "", "last_reserved_ip.0": "10.244.7.3",
		"10.244.7.2": "keep\r\neth0", "10.244.7.3": "stale\r\neth0",
	})
	valid := `"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}]`
	if err := fx.plugin.GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: fx.conf(valid)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if diff := cmp.Diff([]string{".hidden", "corrupt", "keep", "link", "other-net"}, dirNames(t, fx.flannelDir)); diff != "" {
		t.Errorf("flannel's cache after GC (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.244.7.2", "last_reserved_ip.0", "lock"}, dirNames(t, filepath.Join(fx.ipamDir, "cbr0"))); diff != "" {
		t.Errorf("host-local's store after GC (-want +got):\n%s", diff)
	}
	for _, c := range fx.inv.calls {
		if c.Verb == "DEL" {
			t.Errorf("GC ran a DEL for a flannel entry: %+v", c)
		}
	}
}

func TestParseConfFlannelDataDir(t *testing.T) {
	base := `{"cniVersion":"1.1.0","name":"cbr0","type":"overlay-cni","dataDir":"/var/lib/cni/overlay"`
	for in, want := range map[string]string{
		"":                     "",
		`,"flannelDataDir":""`: "",
		`,"flannelDataDir":"/var/lib/cni/flannel/"`:     "/var/lib/cni/flannel",
		`,"flannelDataDir":"/x/../var/lib/cni/flannel"`: "/var/lib/cni/flannel",
	} {
		c, err := ParseConf([]byte(base + in + "}"))
		if err != nil || c.FlannelDataDir != want {
			t.Errorf("ParseConf(%s) = %q, %v; want %q", in, c.FlannelDataDir, err, want)
		}
	}
	for in, msg := range map[string]string{
		`,"flannelDataDir":"var/lib/cni/flannel"`:        "must be an absolute path",
		`,"flannelDataDir":7`:                            "cannot decode",
		`,"flannelDataDir":"/var/lib/cni/overlay/."`:     "is also dataDir",
		`,"flannelDataDir":"/var/lib/cni/flann\u0000el"`: "must be an absolute path",
	} {
		if _, err := ParseConf([]byte(base + in + "}")); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseConf(%s) = %v, want ErrInvalidConfig containing %q", in, err, msg)
		}
	}
}
