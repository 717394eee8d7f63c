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
