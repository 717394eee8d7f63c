package subnet

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnvRoundTripIsTheContract(t *testing.T) {
	e := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1450, true)
	want := "OVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_MTU=1450\nOVERLAY_IPMASQ=true\n"
	if got := string(e.Marshal()); got != want {
		t.Errorf("subnet.env\n got %q\nwant %q", got, want)
	}
	path := filepath.Join(t.TempDir(), "run", "overlay", "subnet.env")
	if err := WriteEnv(path, e); err != nil {
		t.Fatalf("WriteEnv: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("stat: %v, mode %v; want 0644", err, st.Mode().Perm())
	}
	got, err := ReadEnv(path)
	if err != nil || got != e {
		t.Fatalf("ReadEnv = %+v, %v; want %+v", got, err, e)
	}
	if got.Lease() != mustPrefix("10.244.7.0/24") {
		t.Errorf("Lease() = %s", got.Lease())
	}
}

func TestReadEnvMissingWrapsNotExist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subnet.env")
	_, err := ReadEnv(path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadEnv(missing) = %v; want fs.ErrNotExist naming %s", err, path)
	}
}

func TestParseEnv(t *testing.T) {
	ok := "# written by overlayd\n\nOVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_MTU=1450\nOVERLAY_IPMASQ=false\nOVERLAY_FUTURE=1\n"
	if _, err := ParseEnv([]byte(ok)); err != nil {
		t.Fatalf("ParseEnv(valid with comment and unknown key) = %v", err)
	}
	for name, text := range map[string]string{
		"missing MTU":       "OVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_IPMASQ=true\n",
		"bad MTU":           strings.Replace(ok, "1450", "big", 1),
		"tiny MTU":          strings.Replace(ok, "1450", "100", 1),
		"subnet outside":    strings.Replace(ok, "10.244.7.1/24", "10.9.7.1/24", 1),
		"subnet wider":      strings.Replace(ok, "10.244.7.1/24", "10.244.7.1/8", 1),
		"not key=value":     ok + "garbage\n",
		"bad bool":          strings.Replace(ok, "IPMASQ=false", "IPMASQ=maybe", 1),
		"truncated":         ok[:40],
		"empty":             "",
		"ipv6 network":      strings.Replace(ok, "10.244.0.0/16", "fd00::/64", 1),
		"network not cidr":  strings.Replace(ok, "10.244.0.0/16", "10.244.0.0", 1),
		"nul in the middle": strings.Replace(ok, "1450", "14\x0050", 1),
	} {
		if _, err := ParseEnv([]byte(text)); !errors.Is(err, ErrEnvInvalid) {
			t.Errorf("%s: ParseEnv error = %v, want ErrEnvInvalid", name, err)
		}
	}
}

func TestWriteEnvRefusesInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subnet.env")
	if err := WriteEnv(path, Env{}); !errors.Is(err, ErrEnvInvalid) {
		t.Errorf("WriteEnv(zero) = %v, want ErrEnvInvalid", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an invalid env must not be written")
	}
}

func TestDualStackEnv(t *testing.T) {
	e := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1450, true).
		WithIPv6(mustPrefix("fd00:10:244::/48"), mustPrefix("fd00:10:244:7::/64"))
	want := "OVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_MTU=1450\nOVERLAY_IPMASQ=true\n" +
		"OVERLAY_IPV6_NETWORK=fd00:10:244::/48\nOVERLAY_IPV6_SUBNET=fd00:10:244:7::1/64\n"
	if got := string(e.Marshal()); got != want {
		t.Errorf("subnet.env\n got %q\nwant %q", got, want)
	}
	got, err := ParseEnv([]byte(want))
	if err != nil || got != e {
		t.Fatalf("ParseEnv = %+v, %v; want %+v", got, err, e)
	}
	if got.IPv6Lease() != mustPrefix("fd00:10:244:7::/64") || got.Lease() != mustPrefix("10.244.7.0/24") {
		t.Errorf("leases %s and %s", got.Lease(), got.IPv6Lease())
	}
	if v4 := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1450, true); v4.IPv6Lease().IsValid() {
		t.Errorf("an IPv4-only env has the IPv6 lease %s", v4.IPv6Lease())
	}
	for name, text := range map[string]string{
		"network without subnet":  strings.Replace(want, "OVERLAY_IPV6_SUBNET=fd00:10:244:7::1/64\n", "", 1),
		"subnet without network":  strings.Replace(want, "OVERLAY_IPV6_NETWORK=fd00:10:244::/48\n", "", 1),
		"IPv4 in the IPv6 keys":   strings.Replace(want, "fd00:10:244::/48", "10.245.0.0/16", 1),
		"subnet outside":          strings.Replace(want, "fd00:10:244:7::1/64", "fd00:10:245:7::1/64", 1),
		"subnet wider":            strings.Replace(want, "fd00:10:244:7::1/64", "fd00:10:244:7::1/32", 1),
		"IPv4-mapped":             strings.Replace(want, "fd00:10:244::/48", "::ffff:10.244.0.0/112", 1),
		"IPv6 subnet not a cidr":  strings.Replace(want, "fd00:10:244:7::1/64", "fd00:10:244:7::1", 1),
		"IPv6 network is garbage": strings.Replace(want, "fd00:10:244::/48", "eve", 1),
	} {
		if _, err := ParseEnv([]byte(text)); !errors.Is(err, ErrEnvInvalid) || !strings.Contains(err.Error(), "IPV6") {
			t.Errorf("%s: ParseEnv error = %v, want ErrEnvInvalid naming the IPv6 key", name, err)
		}
	}
}

// An IPv6-only host's file has the IPv6 pair and no IPv4 keys; without
// the IPv6 pair the IPv4 one stays required.
func TestIPv6OnlyEnv(t *testing.T) {
	e := Env{MTU: 1430, IPMasq: true}.WithIPv6(mustPrefix("fd00:10:244::/48"), mustPrefix("fd00:10:244:7::/64"))
	want := "OVERLAY_MTU=1430\nOVERLAY_IPMASQ=true\nOVERLAY_IPV6_NETWORK=fd00:10:244::/48\nOVERLAY_IPV6_SUBNET=fd00:10:244:7::1/64\n"
	if got := string(e.Marshal()); got != want {
		t.Errorf("subnet.env\n got %q\nwant %q", got, want)
	}
	got, err := ParseEnv([]byte(want))
	if err != nil || got != e || got.Lease().IsValid() || got.IPv6Lease() != mustPrefix("fd00:10:244:7::/64") {
		t.Fatalf("ParseEnv = %+v (leases %v, %v), %v; want %+v", got, got.Lease(), got.IPv6Lease(), err, e)
	}
	for name, text := range map[string]string{
		"half an IPv4 pair": want + "OVERLAY_NETWORK=10.244.0.0/16\n",
		"no MTU":            strings.Replace(want, "OVERLAY_MTU=1430\n", "", 1),
		"no network at all": "OVERLAY_MTU=1430\nOVERLAY_IPMASQ=true\n",
	} {
		if _, err := ParseEnv([]byte(text)); !errors.Is(err, ErrEnvInvalid) {
			t.Errorf("%s: ParseEnv error = %v, want ErrEnvInvalid", name, err)
		}
	}
}

// flanneldFile is what flanneld v0.28 writes to /run/flannel/subnet.env
// (pkg/subnet WriteSubnetFile) on a dual-stack host: the IPv4 pair, the
// IPv6 pair, then MTU and IPMASQ.
const flanneldFile = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\n" +
	"FLANNEL_IPV6_NETWORK=fd00:10:244::/48\nFLANNEL_IPV6_SUBNET=fd00:10:244:7::1/64\n" +
	"FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"

func TestFlannelEnvIsFlanneldsFormat(t *testing.T) {
	dual := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1450, true).
		WithIPv6(mustPrefix("fd00:10:244::/48"), mustPrefix("fd00:10:244:7::/64"))
	v4 := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1400, false)
	v6 := Env{MTU: 1430, IPMasq: true}.WithIPv6(mustPrefix("fd00:10:244::/48"), mustPrefix("fd00:10:244:7::/64"))
	for name, tc := range map[string]struct {
		env  Env
		want string
	}{
		"dual-stack": {dual, flanneldFile},
		"IPv4 only":  {v4, "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ=false\n"},
		// flanneld writes no FLANNEL_NETWORK when IPv4 is disabled.
		"IPv6 only": {v6, "FLANNEL_IPV6_NETWORK=fd00:10:244::/48\nFLANNEL_IPV6_SUBNET=fd00:10:244:7::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"},
	} {
		if got := string(tc.env.MarshalFlannel()); got != tc.want {
			t.Errorf("%s: MarshalFlannel\n got %q\nwant %q", name, got, tc.want)
		}
		if got, err := tc.env.MarshalFormat(FormatFlannel); err != nil || string(got) != tc.want {
			t.Errorf("%s: MarshalFormat(flannel) = %q, %v", name, got, err)
		}
		got, err := ParseEnv([]byte(tc.want))
		if err != nil || got != tc.env {
			t.Errorf("%s: ParseEnv(flannel's file) = %+v, %v; want %+v", name, got, err, tc.env)
		}
		// The same values in either format parse to the same Env.
		if got, err := ParseEnv(tc.env.Marshal()); err != nil || got != tc.env {
			t.Errorf("%s: ParseEnv(overlay's file) = %+v, %v", name, got, err)
		}
	}
}

func TestWriteEnvFormat(t *testing.T) {
	e := NewEnv(mustPrefix("10.244.0.0/16"), mustPrefix("10.244.7.0/24"), 1450, true)
	dir := t.TempDir()
	for _, f := range []EnvFormat{FormatOverlay, FormatFlannel, ""} {
		path := filepath.Join(dir, "f"+string(f), "subnet.env")
		if err := WriteEnvFormat(path, e, f); err != nil {
			t.Fatalf("WriteEnvFormat(%q): %v", f, err)
		}
		data, _ := os.ReadFile(path)
		want, _ := e.MarshalFormat(f)
		if string(data) != string(want) || (f == FormatFlannel) != strings.HasPrefix(string(data), "FLANNEL_") {
			t.Errorf("format %q wrote %q", f, data)
		}
		if got, err := ReadEnv(path); err != nil || got != e {
			t.Errorf("ReadEnv after WriteEnvFormat(%q) = %+v, %v", f, got, err)
		}
	}
	path := filepath.Join(dir, "bad", "subnet.env")
	if err := WriteEnvFormat(path, e, "yaml"); err == nil || !strings.Contains(err.Error(), `"yaml"`) {
		t.Errorf("WriteEnvFormat(yaml) = %v, want an error naming the format", err)
	}
	if _, err := e.MarshalFormat("yaml"); err == nil {
		t.Error("MarshalFormat(yaml) succeeded")
	}
	// Errors name the keys of the format being written.
	if err := WriteEnvFormat(path, Env{MTU: 1450}, FormatFlannel); !errors.Is(err, ErrEnvInvalid) || !strings.Contains(err.Error(), "FLANNEL_NETWORK") {
		t.Errorf("WriteEnvFormat(flannel, invalid) = %v, want ErrEnvInvalid naming FLANNEL_NETWORK", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a refused write left a file")
	}
}

func TestParseEnvFormat(t *testing.T) {
	for in, want := range map[string]EnvFormat{"": FormatOverlay, "overlay": FormatOverlay, "flannel": FormatFlannel} {
		if got, err := ParseEnvFormat(in); err != nil || got != want {
			t.Errorf("ParseEnvFormat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"Flannel", "FLANNEL_", "env", " overlay"} {
		if _, err := ParseEnvFormat(in); err == nil {
			t.Errorf("ParseEnvFormat(%q) succeeded", in)
		}
	}
}

// Every way a FLANNEL_* file can be wrong is refused naming the FLANNEL_
// key, as an OVERLAY_* file's names its key.
func TestParseFlannelEnvRefuses(t *testing.T) {
	ok := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	if _, err := ParseEnv([]byte("# flanneld\n" + ok + "FLANNEL_FUTURE=1\nOVERLAY_FUTURE=2\n")); err != nil {
		t.Fatalf("ParseEnv(flannel file with comment and unknown keys) = %v", err)
	}
	for name, tc := range map[string]struct{ text, key string }{
		"missing MTU":         {strings.Replace(ok, "FLANNEL_MTU=1450\n", "", 1), "FLANNEL_MTU is missing"},
		"missing IPMASQ":      {strings.Replace(ok, "FLANNEL_IPMASQ=true\n", "", 1), "FLANNEL_IPMASQ is missing"},
		"subnet alone":        {strings.Replace(ok, "FLANNEL_NETWORK=10.244.0.0/16\n", "", 1), "FLANNEL_NETWORK"},
		"network alone":       {strings.Replace(ok, "FLANNEL_SUBNET=10.244.7.1/24\n", "", 1), "FLANNEL_SUBNET"},
		"bad MTU":             {strings.Replace(ok, "1450", "jumbo", 1), "FLANNEL_MTU"},
		"tiny MTU":            {strings.Replace(ok, "1450", "68", 1), "FLANNEL_MTU 68"},
		"bad bool":            {strings.Replace(ok, "IPMASQ=true", "IPMASQ=yes", 1), "FLANNEL_IPMASQ"},
		"subnet outside":      {strings.Replace(ok, "10.244.7.1/24", "10.9.7.1/24", 1), "FLANNEL_SUBNET 10.9.7.1/24 is not inside FLANNEL_NETWORK"},
		"several networks":    {strings.Replace(ok, "10.244.0.0/16", "10.244.0.0/16,10.245.0.0/16", 1), "lists several networks"},
		"IPv6 in IPv4 key":    {strings.Replace(ok, "10.244.0.0/16", "fd00::/48", 1), "FLANNEL_NETWORK"},
		"half an IPv6 pair":   {ok + "FLANNEL_IPV6_NETWORK=fd00:10:244::/48\n", "FLANNEL_IPV6_SUBNET"},
		"not key=value":       {ok + "FLANNEL_MTU\n", "not KEY=VALUE"},
		"only unknown keys":   {"FLANNEL_FUTURE=1\n", "OVERLAY_NETWORK is missing"},
		"IPv6-only no MTU":    {"FLANNEL_IPV6_NETWORK=fd00:10:244::/48\nFLANNEL_IPV6_SUBNET=fd00:10:244:7::1/64\nFLANNEL_IPMASQ=true\n", "FLANNEL_MTU"},
		"network not a cidr":  {strings.Replace(ok, "10.244.0.0/16", "10.244.0.0", 1), "FLANNEL_NETWORK"},
		"IPv6 subnet outside": {ok + "FLANNEL_IPV6_NETWORK=fd00:10:244::/48\nFLANNEL_IPV6_SUBNET=fd00:99::1/64\n", "FLANNEL_IPV6_SUBNET"},
	} {
		_, err := ParseEnv([]byte(tc.text))
		if !errors.Is(err, ErrEnvInvalid) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: ParseEnv error = %v, want ErrEnvInvalid containing %q", name, err, tc.key)
		}
	}
}

// A file with keys of both formats is refused, naming the keys of each:
// which values are meant would be a guess.
func TestParseEnvRefusesMixedFormats(t *testing.T) {
	overlay := "OVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_MTU=1450\nOVERLAY_IPMASQ=true\n"
	for name, tc := range map[string]struct{ text, want string }{
		"whole files": {overlay + flanneldFile, "overlayd's (OVERLAY_NETWORK, OVERLAY_SUBNET, OVERLAY_MTU, OVERLAY_IPMASQ) and flanneld's (FLANNEL_NETWORK, FLANNEL_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ, FLANNEL_IPV6_NETWORK, FLANNEL_IPV6_SUBNET)"},
		"one stray":   {overlay + "FLANNEL_MTU=8951\n", "and flanneld's (FLANNEL_MTU)"},
		"invalid too": {flanneldFile + "OVERLAY_IPMASQ=maybe\n", "overlayd's (OVERLAY_IPMASQ)"},
	} {
		_, err := ParseEnv([]byte(tc.text))
		if !errors.Is(err, ErrEnvInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "both formats") {
			t.Errorf("%s: ParseEnv error = %v, want ErrEnvInvalid naming %q", name, err, tc.want)
		}
	}
}
