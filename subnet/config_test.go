package subnet

import (
	"errors"
	"net/netip"
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
			want: Config{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0"),
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "a /24 network is split in four",
			json: `{"Network":"10.1.2.0/24","Backend":{"Type":"vxlan"}}`,
			want: Config{Network: mustPrefix("10.1.2.0/24"), SubnetLen: 26,
				SubnetMin: mustAddr("10.1.2.64"), SubnetMax: mustAddr("10.1.2.192"),
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "a /22 still gets /24 subnets",
			json: `{"Network":"10.0.0.0/22"}`,
			want: Config{Network: mustPrefix("10.0.0.0/22"), SubnetLen: 24,
				SubnetMin: mustAddr("10.0.1.0"), SubnetMax: mustAddr("10.0.3.0"),
				Backend: BackendConfig{Type: "vxlan", VNI: 1, Port: 8472}},
		},
		{
			name: "explicit values and unknown fields",
			json: `{"Network":"10.244.0.0/16","SubnetLen":25,"SubnetMin":"10.244.10.0","SubnetMax":"10.244.20.128",
				"EnableIPv6":false,"Backend":{"Type":"VXLAN","VNI":42,"Port":4789,"DirectRouting":true,"MTU":1400,"GBP":false}}`,
			want: Config{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 25,
				SubnetMin: mustAddr("10.244.10.0"), SubnetMax: mustAddr("10.244.20.128"),
				Backend: BackendConfig{Type: "vxlan", VNI: 42, Port: 4789, DirectRouting: true, MTU: 1400}},
		},
		{
			name: "port 0 means the default, as in flannel",
			json: `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","Port":0}}`,
			want: Config{Network: mustPrefix("10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr("10.244.1.0"), SubnetMax: mustAddr("10.244.255.0"),
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
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		// Whatever is accepted must be self-consistent.
		if !cfg.InRange(netip.PrefixFrom(cfg.SubnetMin, cfg.SubnetLen)) || !cfg.InRange(netip.PrefixFrom(cfg.SubnetMax, cfg.SubnetLen)) {
			t.Fatalf("accepted config with SubnetMin/SubnetMax out of range: %+v", cfg)
		}
		if n := cfg.Count(); n < 1 {
			t.Fatalf("accepted config with %d subnets: %+v", n, cfg)
		}
		if got := cfg.SubnetAt(cfg.Count() - 1).Addr(); got != cfg.SubnetMax {
			t.Fatalf("last subnet %s != SubnetMax %s", got, cfg.SubnetMax)
		}
	})
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
