package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConfigDefaults(t *testing.T) {
	tests := []struct {
		name string
		json string
		want Config
	}{
		{
			name: "flannel defaults for a /16",
			json: `{"Network":"10.244.0.0/16"}`,
			want: Config{EnableIPv4: true, Pool: Pool{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "a /24 network is split in four",
			json: `{"Network":"10.1.2.0/24","Backend":{"Type":"vxlan"}}`,
			want: Config{EnableIPv4: true, Pool: Pool{Network: mustPrefix("10.1.2.0/24"), SubnetLen: 26,
				SubnetMin: mustAddr("10.1.2.64"), SubnetMax: mustAddr("10.1.2.192")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "a /22 still gets /24 subnets",
			json: `{"Network":"10.0.0.0/22"}`,
			want: Config{EnableIPv4: true, Pool: Pool{Network: mustPrefix("10.0.0.0/22"), SubnetLen: 24,
				SubnetMin: mustAddr("10.0.1.0"), SubnetMax: mustAddr("10.0.3.0")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "explicit values and unknown fields",
			json: `{"Network":"10.244.0.0/16","SubnetLen":25,"SubnetMin":"10.244.10.0","SubnetMax":"10.244.20.128",
				"EnableIPv6":false,"Backend":{"Type":"VXLAN","VNI":42,"Port":4789,"DirectRouting":true,"MTU":1400,"GBP":false}}`,
			want: Config{EnableIPv4: true, Pool: Pool{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 25,
				SubnetMin: mustAddr("10.244.10.0"), SubnetMax: mustAddr("10.244.20.128")},
				Backend: BackendConfig{Type: "vxlan", VNI: 42, Port: 4789, DirectRouting: true, MTU: 1400,
					Extra: []Member{{"GBP", json.RawMessage("false")}}}},
		},
		{
			name: "dual stack: flannel's IPv6 defaults for a /48",
			json: `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`,
			want: Config{EnableIPv4: true, EnableIPv6: true,
				Pool:    Pool{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24, SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0")},
				IPv6:    Pool{Network: mustPrefix("fd00:10:244::/48"), SubnetLen: 64, SubnetMin: mustAddr("fd00:10:244:1::"), SubnetMax: mustAddr("fd00:10:244:ffff::")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "IPv6 only; a small IPv6 network is split in four",
			json: `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::100/120","Network":"ignored when IPv4 is off"}`,
			want: Config{EnableIPv6: true,
				IPv6:    Pool{Network: mustPrefix("fd00::100/120"), SubnetLen: 122, SubnetMin: mustAddr("fd00::140"), SubnetMax: mustAddr("fd00::1c0")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472},
				Extra:   []Member{{"Network", json.RawMessage(`"ignored when IPv4 is off"`)}}},
		},
		{
			name: "explicit IPv6 values",
			json: `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48","IPv6SubnetLen":80,
				"IPv6SubnetMin":"fd00:10:244:7::","IPv6SubnetMax":"fd00:10:244:7:1::"}`,
			want: Config{EnableIPv4: true, EnableIPv6: true,
				Pool:    Pool{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24, SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0")},
				IPv6:    Pool{Network: mustPrefix("fd00:10:244::/48"), SubnetLen: 80, SubnetMin: mustAddr("fd00:10:244:7::"), SubnetMax: mustAddr("fd00:10:244:7:1::")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "port 0 means the default, as in flannel",
			json: `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","Port":0}}`,
			want: Config{EnableIPv4: true, Pool: Pool{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0")},
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tt.json))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			if diff := cmp.Diff(tt.want, *got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrorsNameFieldAndValue(t *testing.T) {
	tests := []struct {
		name string
		json string
		want []string // substrings the error must contain
	}{
		{"not JSON", `{"Network":`, []string{"not valid JSON", "ends early"}},
		{"syntax error", "{\n  \"Network\": \"10.0.0.0/16\",\n}", []string{"not valid JSON at line 3, column 1"}},
		{"trailing data", `{"Network":"10.0.0.0/16"} {}`, []string{"unexpected data after the JSON object at line 1, column 27"}},
		{"missing network", `{}`, []string{"Network is missing"}},
		{"network not a prefix", `{"Network":"10.0.0.0"}`, []string{"Network", `"10.0.0.0"`}},
		{"ipv6 network", `{"Network":"fd00::/64"}`, []string{"Network", "IPv4"}},
		{"host bits", `{"Network":"10.0.0.1/16"}`, []string{"host bits", "10.0.0.0/16"}},
		{"network too small", `{"Network":"10.0.0.0/29"}`, []string{"too small"}},
		{"subnetlen too long", `{"Network":"10.0.0.0/16","SubnetLen":31}`, []string{"SubnetLen 31"}},
		{"subnetlen negative", `{"Network":"10.0.0.0/16","SubnetLen":-1}`, []string{"SubnetLen -1"}},
		{"too few subnets", `{"Network":"10.0.0.0/16","SubnetLen":17}`, []string{"SubnetLen 17", "use 18"}},
		{"subnetmin garbage", `{"Network":"10.0.0.0/16","SubnetMin":"x"}`, []string{"SubnetMin", `"x"`}},
		{"subnetmin outside", `{"Network":"10.0.0.0/16","SubnetMin":"10.1.0.0"}`, []string{"SubnetMin 10.1.0.0", "outside"}},
		{"subnetmax unaligned", `{"Network":"10.0.0.0/16","SubnetMax":"10.0.3.7"}`, []string{"SubnetMax 10.0.3.7", "boundary", "10.0.3.0"}},
		{"min above max", `{"Network":"10.0.0.0/16","SubnetMin":"10.0.9.0","SubnetMax":"10.0.3.0"}`, []string{"SubnetMin 10.0.9.0", "above"}},
		{"backend type", `{"Network":"10.0.0.0/16","Backend":{"Type":"udp"}}`, []string{"Backend.Type", `"udp"`}},
		{"vni zero", `{"Network":"10.0.0.0/16","Backend":{"VNI":0}}`, []string{"Backend.VNI 0"}},
		{"vni too big", `{"Network":"10.0.0.0/16","Backend":{"VNI":16777216}}`, []string{"Backend.VNI 16777216"}},
		{"port too big", `{"Network":"10.0.0.0/16","Backend":{"Port":70000}}`, []string{"Backend.Port 70000"}},
		{"mtu too small", `{"Network":"10.0.0.0/16","Backend":{"MTU":100}}`, []string{"Backend.MTU 100"}},
		{"wrong type", `{"Network":"10.0.0.0/16","SubnetLen":"24"}`, []string{`"SubnetLen": want a whole number such as 24, got "24"`}},
		{"huge", `{"Network":"10.0.0.0/16","x":"` + strings.Repeat("a", MaxConfigSize) + `"}`, []string{"limit"}},
		{"no family", `{"Network":"10.0.0.0/16","EnableIPv4":false}`, []string{"EnableIPv4 and EnableIPv6 are both false"}},
		{"ipv6 without network", `{"Network":"10.0.0.0/16","EnableIPv6":true}`, []string{"IPv6Network is missing", "fd00:10:244::/48"}},
		{"ipv6 network is ipv4", `{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":"10.1.0.0/16"}`, []string{`IPv6Network "10.1.0.0/16" is not an IPv6 prefix`}},
		{"ipv6 network mapped ipv4", `{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":"::ffff:10.1.0.0/112"}`, []string{"IPv6Network", "not an IPv6 prefix"}},
		{"ipv6 host bits", `{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::1/48"}`, []string{"IPv6Network", "host bits", "fd00::/48"}},
		{"ipv6 network too small", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/125"}`, []string{"IPv6Network fd00::/125 is too small", "/124"}},
		{"ipv6 subnetlen too long", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetLen":127}`, []string{"IPv6SubnetLen 127", "1..126"}},
		{"ipv6 too few subnets", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetLen":49}`, []string{"IPv6SubnetLen 49", "use 50"}},
		{"ipv6 subnetmin ipv4", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetMin":"10.0.0.0"}`, []string{`IPv6SubnetMin "10.0.0.0" is not an IPv6 address`}},
		{"ipv6 subnetmin outside", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetMin":"fd01::"}`, []string{"IPv6SubnetMin fd01::", "outside IPv6Network"}},
		{"ipv6 subnetmax unaligned", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetMax":"fd00:0:0:5::1"}`, []string{"IPv6SubnetMax fd00:0:0:5::1", "/64 boundary", "fd00:0:0:5::"}},
		{"ipv6 min above max", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetMin":"fd00:0:0:9::","IPv6SubnetMax":"fd00:0:0:3::"}`, []string{"IPv6SubnetMin fd00:0:0:9::", "above"}},
		{"ipv4 still checked in dual stack", `{"Network":"10.0.0.0/29","EnableIPv6":true,"IPv6Network":"fd00::/48"}`, []string{"Network 10.0.0.0/29 is too small"}},
	}
	for _, tt := range append(tests, jsonTypeErrors...) {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.json))
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseConfig(%s) error = %v, want ErrInvalidConfig", tt.json, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			for _, goWord := range []string{"Go ", "rawConfig", "rawBackend", "unmarshal", "struct", "int64", "json:"} {
				if strings.Contains(err.Error(), goWord) {
					t.Errorf("error %q shows Go internals (%q)", err, goWord)
				}
			}
		})
	}
}

// jsonTypeErrors: every field of the config with a value of the wrong JSON
// type; the error names the field as written and quotes the value (issue
// 13: "Go struct field rawConfig.SubnetLen of type int").
var jsonTypeErrors = []struct {
	name string
	json string
	want []string
}{
	{"top-level array", `[{"Network":"10.0.0.0/16"}]`, []string{`want a JSON object, got [{"Network":"10.0.0.0/16"}]`}},
	{"top-level string", `"10.0.0.0/16"`, []string{`want a JSON object, got "10.0.0.0/16"`}},
	{"empty", ``, []string{"want a JSON object, got nothing"}},
	{"Network number", `{"Network":10}`, []string{`"Network": want a string such as "10.244.0.0/16", got 10`}},
	{"network lower case", `{"network":["10.0.0.0/16"]}`, []string{`"network": want a string`, `got ["10.0.0.0/16"]`}},
	{"SubnetLen fraction", `{"Network":"10.0.0.0/16","SubnetLen":24.5}`, []string{`"SubnetLen": want a whole number such as 24, got 24.5`}},
	{"SubnetMin number", `{"Network":"10.0.0.0/16","SubnetMin":1}`, []string{`"SubnetMin": want a string`, "got 1"}},
	{"SubnetMax bool", `{"Network":"10.0.0.0/16","SubnetMax":true}`, []string{`"SubnetMax": want a string`, "got true"}},
	{"Backend string", `{"Network":"10.0.0.0/16","Backend":"vxlan"}`, []string{`"Backend": want a JSON object, got "vxlan"`}},
	{"Backend.Type number", `{"Network":"10.0.0.0/16","Backend":{"Type":1}}`, []string{`"Backend.Type": want a string`}},
	{"Backend.VNI string", `{"Network":"10.0.0.0/16","backend":{"vni":"7"}}`, []string{`"backend.vni": want a whole number in 1..16777215, got "7"`}},
	{"Backend.Port string", `{"Network":"10.0.0.0/16","Backend":{"Port":"8472"}}`, []string{`"Backend.Port": want a whole number in 1..65535, got "8472"`}},
	{"Backend.DirectRouting string", `{"Network":"10.0.0.0/16","Backend":{"DirectRouting":"yes"}}`, []string{`"Backend.DirectRouting": want true or false, got "yes"`}},
	{"Backend.MTU object", `{"Network":"10.0.0.0/16","Backend":{"MTU":{}}}`, []string{`"Backend.MTU": want a whole number`, "got {}"}},
	{"EnableIPv6 string", `{"Network":"10.0.0.0/16","EnableIPv6":"true"}`, []string{`"EnableIPv6": want true or false, got "true"`}},
	{"EnableIPv4 number", `{"Network":"10.0.0.0/16","EnableIPv4":1}`, []string{`"EnableIPv4": want true or false, got 1`}},
	{"IPv6Network number", `{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":6}`, []string{`"IPv6Network": want a string such as "fd00:10:244::/48", got 6`}},
	{"IPv6SubnetLen string", `{"Network":"10.0.0.0/16","IPv6SubnetLen":"64"}`, []string{`"IPv6SubnetLen": want a whole number such as 64, got "64"`}},
	{"IPv6SubnetMin number", `{"Network":"10.0.0.0/16","IPv6SubnetMin":1}`, []string{`"IPv6SubnetMin": want a string`}},
	{"IPv6SubnetMax array", `{"Network":"10.0.0.0/16","IPv6SubnetMax":[]}`, []string{`"IPv6SubnetMax": want a string`}},
	{"long value shortened", `{"Network":"` + strings.Repeat("9", 100) + `","SubnetLen":"` + strings.Repeat("9", 100) + `"}`, []string{`"SubnetLen"`, "..."}},
}

func TestContainsAndInRange(t *testing.T) {
	cfg := mustConfig(t, `{"Network":"10.244.0.0/16","SubnetMin":"10.244.10.0","SubnetMax":"10.244.20.0"}`)
	for _, tt := range []struct {
		p                 string
		contains, inRange bool
	}{
		{"10.244.15.0/24", true, true},
		{"10.244.10.0/24", true, true},
		{"10.244.20.0/24", true, true},
		{"10.244.9.0/24", true, false},
		{"10.244.0.0/24", true, false},
		{"10.244.15.0/25", false, false},
		{"10.245.0.0/24", false, false},
	} {
		p := mustPrefix(tt.p)
		if got := cfg.Contains(p); got != tt.contains {
			t.Errorf("Contains(%s) = %v, want %v", p, got, tt.contains)
		}
		if got := cfg.InRange(p); got != tt.inRange {
			t.Errorf("InRange(%s) = %v, want %v", p, got, tt.inRange)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	f.Add([]byte(`{"Network":"10.1.2.0/24","SubnetLen":30,"SubnetMin":"10.1.2.4","SubnetMax":"10.1.2.252"}`))
	f.Add([]byte(`{"Network":"0.0.0.0/0"}`))
	f.Add([]byte(`{"Network":"10.0.0.0/28","Backend":{"VNI":16777215,"Port":65535,"MTU":65485}}`))
	f.Add([]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`))
	f.Add([]byte(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"::/0","IPv6SubnetLen":126}`))
	f.Add([]byte(`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/124","IPv6SubnetMin":"fd00::4"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		// Whatever is accepted must be self-consistent, and survive being
		// written back (config set stores the rendered form).
		if cfg.EnableIPv4 {
			checkPool(t, cfg.Pool)
		}
		if cfg.EnableIPv6 {
			checkPool(t, cfg.IPv6)
		}
		// As the CLI prints it (printer.Write): json.Marshal would write
		// a kept member's "&" as "\u0026", the same string in other bytes.
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(cfg); err != nil {
			t.Fatal(err)
		}
		out := buf.Bytes()
		again, err := ParseConfig(out)
		if err != nil || !reflect.DeepEqual(again, cfg) {
			t.Fatalf("rendered config %s parses to %+v (%v), not %+v", out, again, err, cfg)
		}
	})
}

// checkPool fails unless p's bounds are subnets it hands out and its
// arithmetic reaches SubnetMax from SubnetMin.
func checkPool(t *testing.T, p Pool) {
	t.Helper()
	if !p.InRange(netip.PrefixFrom(p.SubnetMin, p.SubnetLen)) || !p.InRange(netip.PrefixFrom(p.SubnetMax, p.SubnetLen)) {
		t.Fatalf("pool with SubnetMin/SubnetMax out of range: %+v", p)
	}
	n := p.Count()
	if n < 1 {
		t.Fatalf("pool with %d subnets: %+v", n, p)
	}
	if n < math.MaxInt {
		if got := p.SubnetAt(n - 1).Addr(); got != p.SubnetMax {
			t.Fatalf("last subnet %s != SubnetMax %s", got, p.SubnetMax)
		}
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

func mustConfig(t testing.TB, s string) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(s))
	if err != nil {
		t.Fatalf("ParseConfig(%s): %v", s, err)
	}
	return cfg
}

// A network that can never be a cluster network is refused when the config
// is parsed, naming the rule (issue 28): the default route (which holds
// every host's own underlay address), and ranges hosts do not route.
// Ranges beside them stay valid.
func TestParseConfigRefusesRangesThatCanNeverBeAClusterNetwork(t *testing.T) {
	v6 := func(n string) string {
		return `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"` + n + `"}`
	}
	for _, tt := range []struct {
		json string
		want []string
	}{
		{`{"Network":"0.0.0.0/0"}`, []string{"Network 0.0.0.0/0 is the default route", "can never be a cluster network", "10.244.0.0/16"}},
		{`{"Network":"0.0.0.0/8"}`, []string{"Network 0.0.0.0/8 is inside the \"this network\" range 0.0.0.0/8"}},
		{`{"Network":"0.0.0.0/1"}`, []string{"Network 0.0.0.0/1 contains the \"this network\" range"}},
		{`{"Network":"127.0.0.0/16"}`, []string{"Network 127.0.0.0/16 is inside the loopback range 127.0.0.0/8"}},
		{`{"Network":"169.254.0.0/16"}`, []string{"link-local range 169.254.0.0/16"}},
		{`{"Network":"224.0.0.0/8"}`, []string{"Network 224.0.0.0/8 is inside the multicast range 224.0.0.0/4"}},
		{`{"Network":"192.0.0.0/2"}`, []string{"Network 192.0.0.0/2 contains the multicast range 224.0.0.0/4"}},
		{`{"Network":"240.0.0.0/16"}`, []string{"reserved range 240.0.0.0/4 (class E"}},
		{`{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":"::/0"}`, []string{"IPv6Network ::/0 is the default route", "fd00:10:244::/48"}},
		{v6("::/0"), []string{"IPv6Network ::/0 is the default route"}},
		{v6("::/64"), []string{"IPv6Network ::/64 contains the loopback address ::1"}},
		{v6("fe80::/64"), []string{"IPv6Network fe80::/64 is inside the link-local range fe80::/10"}},
		{v6("ff00::/16"), []string{"IPv6Network ff00::/16 is inside the multicast range ff00::/8"}},
		{v6("8000::/1"), []string{"IPv6Network 8000::/1 contains the link-local range fe80::/10"}},
	} {
		cfg, err := ParseConfig([]byte(tt.json))
		if err == nil {
			err = cfg.CheckStorable()
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseConfig(%s) = %v, want ErrInvalidConfig", tt.json, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseConfig(%s): error %q does not say %q", tt.json, err, w)
			}
		}
	}
	for _, ok := range []string{`{"Network":"1.0.0.0/8"}`, `{"Network":"126.0.0.0/8"}`, `{"Network":"128.0.0.0/3"}`,
		`{"Network":"169.253.0.0/16"}`, `{"Network":"192.0.0.0/3"}`, v6("2000::/3"), v6("fd00::/8"), v6("fe00::/9"), v6("::100/120")} {
		if _, err := ParseConfig([]byte(ok)); err != nil {
			t.Errorf("ParseConfig(%s) = %v, want it accepted", ok, err)
		}
	}
}

// A stored network in the class E range is read: Linux routes it as
// unicast, some clusters carry pods in it and flanneld reads it, so a
// reader refusing it would turn an upgrade into an outage. Only storing a
// new one is refused.
func TestStoredClassENetworkIsStillRead(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"240.10.0.0/16"}`))
	if err != nil {
		t.Fatalf("ParseConfig of a stored class E network: %v", err)
	}
	if err := cfg.CheckStorable(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "240.0.0.0/4 (class E") {
		t.Errorf("CheckStorable = %v, want the class E rule named", err)
	}
	if err := mustConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/48"}`).CheckStorable(); err != nil {
		t.Errorf("CheckStorable of an ordinary dual-stack network: %v", err)
	}
}
