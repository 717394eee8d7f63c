package delegate

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testDelegate(t *testing.T, network string) Delegate {
	t.Helper()
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"` + network + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Render(c, testEnv(true))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestAttachmentValidate(t *testing.T) {
	ok := Attachment{Network: "overlay", ContainerID: "0123abcd", IfName: "eth0"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%v) = %v", ok, err)
	}
	for _, tc := range []struct {
		name string
		a    Attachment
	}{
		{"empty container ID", Attachment{"overlay", "", "eth0"}},
		{"empty ifname", Attachment{"overlay", "c1", ""}},
		{"empty network", Attachment{"", "c1", "eth0"}},
		{"container ID with slash", Attachment{"overlay", "a/b", "eth0"}},
		{"container ID dot dot", Attachment{"overlay", "..", "eth0"}},
		{"container ID dot dot inside", Attachment{"overlay", "a..b", "eth0"}},
		{"container ID traversal", Attachment{"overlay", "../../etc/passwd", "eth0"}},
		{"container ID NUL", Attachment{"overlay", "a\x00b", "eth0"}},
		{"container ID backslash", Attachment{"overlay", `a\b`, "eth0"}},
		{"container ID space", Attachment{"overlay", "a b", "eth0"}},
		{"container ID leading dot", Attachment{"overlay", ".hidden", "eth0"}},
		{"ifname with slash", Attachment{"overlay", "c1", "eth/0"}},
		{"ifname dot dot", Attachment{"overlay", "c1", ".."}},
		{"ifname dot dot inside", Attachment{"overlay", "c1", "a..b"}},
		{"ifname NUL", Attachment{"overlay", "c1", "eth\x000"}},
		{"ifname too long", Attachment{"overlay", "c1", "abcdefghijklmnop"}},
		{"ifname colon", Attachment{"overlay", "c1", "eth0:1"}},
		{"network with slash", Attachment{"a/b", "c1", "eth0"}},
		{"file name too long", Attachment{"overlay", strings.Repeat("a", 250), "eth0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.a.Validate(); !errors.Is(err, ErrInvalidAttachment) {
				t.Errorf("Validate(%q) = %v, want ErrInvalidAttachment", tc.a, err)
			}
			if _, err := (Cache{Dir: t.TempDir()}).Path(tc.a); !errors.Is(err, ErrInvalidAttachment) {
				t.Errorf("Path(%q) = %v, want ErrInvalidAttachment", tc.a, err)
			}
		})
	}
}

func TestCachePathLayout(t *testing.T) {
	dir := t.TempDir()
	p, err := Cache{Dir: dir + "/"}.Path(Attachment{"overlay", "c-1", "net-1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "overlay-c-1-net-1"); p != want {
		t.Errorf("Path = %q, want %q", p, want)
	}
}

func TestCacheWriteReadRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lib", "overlay")
	c := Cache{Dir: dir}
	a := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	d := testDelegate(t, "overlay")

	if _, err := c.Read(a); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read before Write = %v, want fs.ErrNotExist", err)
	}
	if err := c.Write(a, d); err != nil {
		t.Fatalf("Write: %v", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode = %v, want 0700", fi.Mode().Perm())
	}
	p, _ := c.Path(a)
	fi, err = os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("cache file mode = %v, want 0600", fi.Mode().Perm())
	}
	got, err := c.Read(a)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if diff := cmp.Diff(Entry{Attachment: a, Delegate: d}, got, cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}
	if err := c.Remove(a); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := c.Remove(a); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := c.Read(a); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read after Remove = %v, want fs.ErrNotExist", err)
	}
}

func TestCacheTightensDirMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "overlay")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (Cache{Dir: dir}).Write(Attachment{"overlay", "c1", "eth0"}, testDelegate(t, "overlay")); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dir)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("cache dir mode = %v, want 0700", fi.Mode().Perm())
	}
}

// TestCacheReadCorrupt: every way a cache file can be damaged gives an
// error wrapping ErrCacheCorrupt, never a panic and never a half-usable
// entry.
func TestCacheReadCorrupt(t *testing.T) {
	a := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	dir := t.TempDir()
	c := Cache{Dir: dir}
	if err := c.Write(a, testDelegate(t, "overlay")); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Path(a)
	good, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	other := Attachment{Network: "overlay", ContainerID: "c2", IfName: "eth0"}
	if err := c.Write(other, testDelegate(t, "overlay")); err != nil {
		t.Fatal(err)
	}
	op, _ := c.Path(other)
	otherData, _ := os.ReadFile(op)

	cases := map[string][]byte{
		"empty":               {},
		"whitespace":          []byte("  \n"),
		"not JSON":            []byte("garbage"),
		"JSON null":           []byte("null"),
		"wrong format":        []byte(strings.Replace(string(good), `"format":1`, `"format":2`, 1)),
		"bad lease":           []byte(strings.Replace(string(good), `"lease":"10.244.7.0/24"`, `"lease":"x"`, 1)),
		"no config":           []byte(strings.Replace(string(good), `"config":`, `"unused":`, 1)),
		"config without type": []byte(strings.Replace(string(good), `"type":"bridge"`, `"type":""`, 1)),
		"config type path":    []byte(strings.Replace(string(good), `"type":"bridge"`, `"type":"../sh"`, 1)),
		"other attachment":    otherData,
		"too large":           []byte(strings.Repeat(" ", maxCacheFile+1)),
	}
	for i := 1; i < len(good); i += len(good)/7 + 1 {
		cases[fmt.Sprintf("truncated to %d bytes", i)] = good[:i]
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Read(a); !errors.Is(err, ErrCacheCorrupt) {
				t.Errorf("Read(%q) = %v, want ErrCacheCorrupt", data, err)
			}
		})
	}
}

func TestCacheList(t *testing.T) {
	dir := t.TempDir()
	c := Cache{Dir: dir}
	mine := []Attachment{{"overlay", "c1", "eth0"}, {"overlay", "c-2", "net-1"}}
	for _, a := range mine {
		if err := c.Write(a, testDelegate(t, "overlay")); err != nil {
			t.Fatal(err)
		}
	}
	// A network whose name starts like ours, a temporary file, a directory.
	if err := c.Write(Attachment{"overlay-v2", "c3", "eth0"}, testDelegate(t, "overlay-v2")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".overlay-c9-eth0.tmp-1"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "overlay-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay-broken-eth0"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	listed, err := c.List("overlay")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range listed {
		if l.Err != nil {
			if !errors.Is(l.Err, ErrCacheCorrupt) {
				t.Errorf("%s: error %v, want ErrCacheCorrupt", l.Path, l.Err)
			}
			got = append(got, "corrupt "+filepath.Base(l.Path))
			continue
		}
		got = append(got, l.Entry.Attachment.String())
	}
	want := []string{"corrupt overlay-broken-eth0", mine[1].String(), mine[0].String()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if l, err := (Cache{Dir: filepath.Join(dir, "missing")}).List("overlay"); err != nil || len(l) != 0 {
		t.Errorf("List of a missing dir = %v, %v; want nothing", l, err)
	}
}

// A dual-stack entry keeps its IPv6 lease; an IPv4-only entry is written as
// before (no ipv6Lease member), and an entry with a broken one is corrupt.
func TestCacheIPv6Lease(t *testing.T) {
	c := Cache{Dir: t.TempDir()}
	a := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	d := testDelegate(t, "overlay")
	p, _ := c.Path(a)
	if err := c.Write(a, d); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(p); strings.Contains(string(data), "ipv6Lease") {
		t.Errorf("IPv4-only entry mentions an IPv6 lease: %s", data)
	}
	d.IPv6Lease = netip.MustParsePrefix("fd00:10:244:7::/64")
	if err := c.Remove(a); err != nil { // an entry is never replaced
		t.Fatal(err)
	}
	if err := c.Write(a, d); err != nil {
		t.Fatal(err)
	}
	got, err := c.Read(a)
	if err != nil || got.Delegate.IPv6Lease != d.IPv6Lease || got.Delegate.Lease != d.Lease {
		t.Fatalf("Read = %+v, %v; want the leases %s and %s", got.Delegate, err, d.Lease, d.IPv6Lease)
	}
	good, _ := os.ReadFile(p)
	for _, bad := range []string{`"x"`, `"10.245.0.0/16"`, `7`} {
		data := strings.Replace(string(good), `"ipv6Lease":"fd00:10:244:7::/64"`, `"ipv6Lease":`+bad, 1)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(a); !errors.Is(err, ErrCacheCorrupt) {
			t.Errorf("ipv6Lease %s: Read = %v, want ErrCacheCorrupt", bad, err)
		}
	}
}

// An IPv6-only host's entry has an IPv6 lease and no IPv4 one; an entry
// with neither, or with an IPv6 prefix as its IPv4 lease, is corrupt.
func TestCacheIPv6OnlyEntry(t *testing.T) {
	c := Cache{Dir: t.TempDir()}
	a := Attachment{Network: "overlay", ContainerID: "c1", IfName: "eth0"}
	d := testDelegate(t, "overlay")
	d.Lease, d.IPv6Lease = netip.Prefix{}, netip.MustParsePrefix("fd00:10:244:7::/64")
	if err := c.Write(a, d); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Path(a)
	good, _ := os.ReadFile(p)
	if strings.Contains(string(good), `"lease"`) {
		t.Errorf("IPv6-only entry has an IPv4 lease member: %s", good)
	}
	got, err := c.Read(a)
	if err != nil || got.Delegate.Lease.IsValid() || got.Delegate.IPv6Lease != d.IPv6Lease {
		t.Fatalf("Read = %+v, %v; want only the IPv6 lease %s", got.Delegate, err, d.IPv6Lease)
	}
	for name, data := range map[string]string{
		"no lease at all":    strings.Replace(string(good), `"ipv6Lease":"fd00:10:244:7::/64",`, "", 1),
		"IPv6 as IPv4 lease": strings.Replace(string(good), `"ipv6Lease":`, `"lease":"fd00::/64","ipv6Lease":`, 1),
		"empty IPv4 lease":   strings.Replace(string(good), `"ipv6Lease":`, `"lease":"x","ipv6Lease":`, 1),
	} {
		if data == string(good) {
			t.Fatalf("%s: the replacement did not apply to %s", name, good)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(a); !errors.Is(err, ErrCacheCorrupt) {
			t.Errorf("%s: Read = %v, want ErrCacheCorrupt", name, err)
		}
	}
}
