package delegate

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/subnet"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/render")

func testEnv(ipMasq bool) subnet.Env {
	return subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, ipMasq)
}

// TestRenderGolden renders the delegate configuration of typical and
// tricky network configurations and compares it with testdata/render/*.json
// (go test -run TestRenderGolden -update rewrites them).
func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		conf   string
		ipMasq bool
		dual   bool // a dual-stack host: a second range set and route
		v6only bool // an IPv6-only host: the IPv6 range set and route alone
	}{
		{
			// The configuration of deploy/cni/10-overlay.conflist, as
			// libcni v1.2+ sends it (1.1.0, from cniVersions).
			name:   "conflist",
			conf:   `{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`,
			ipMasq: true,
		},
		{
			name:   "minimal-bridge-masquerades",
			conf:   `{"cniVersion":"0.3.0","name":"overlay","type":"overlay-cni"}`,
			ipMasq: false,
		},
		{
			name: "delegate-overrides",
			conf: `{"cniVersion":"1.0.0","name":"pods","type":"overlay-cni","delegate":{
				"type":"my-bridge","bridge":"br-pods","mtu":1400,"isGateway":false,"ipMasq":true,
				"name":"not-used","cniVersion":"0.1.0","prevResult":{"x":1},"cni.dev/x":1,"runtimeConfig":{"mac":"user"}}}`,
			ipMasq: true,
		},
		{
			name: "ipam-base",
			conf: `{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","ipam":{
				"type":"dhcp","dataDir":"/var/lib/overlay-ipam","resolvConf":"/etc/resolv.conf",
				"subnet":"1.2.3.0/24","rangeStart":"1.2.3.10","gateway":"1.2.3.1",
				"ranges":[[{"subnet":"9.9.9.0/24"}]],
				"routes":[{"dst":"10.244.0.0/16"},{"dst":"192.168.0.0/16","gw":"10.244.7.1"},{"dst":"192.168.0.0/16","gw":"10.244.7.1"},{"dst":"172.16.0.1/12","mtu":1300}]}}`,
			ipMasq: true,
		},
		{
			name: "delegate-ipam-and-runtime",
			conf: `{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni",
				"delegate":{"ipam":{"routes":[{"dst":"0.0.0.0/0"}]},"runtimeConfig":{"mac":"user"}},
				"runtimeConfig":{"mac":"0e:00:00:00:00:01","portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"tcp"}]},
				"args":{"cni":{"ips":["10.244.7.9"]}}}`,
			ipMasq: true,
		},
		{
			name: "dual-stack",
			conf: `{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","delegate":{"hairpinMode":true,"isDefaultGateway":true},
				"ipam":{"routes":[{"dst":"10.244.0.0/16"},{"dst":"192.168.0.0/16"}]}}`,
			ipMasq: true,
			dual:   true,
		},
		{
			name: "ipv6-only",
			conf: `{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","delegate":{"hairpinMode":true,"isDefaultGateway":true},
				"ipam":{"routes":[{"dst":"fd99::/64","gw":"fd00:10:244:7::1"}]}}`,
			ipMasq: true,
			v6only: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConf([]byte(tc.conf))
			if err != nil {
				t.Fatalf("ParseConf: %v", err)
			}
			env := testEnv(tc.ipMasq)
			wantLease, wantLease6 := netip.MustParsePrefix("10.244.7.0/24"), netip.Prefix{}
			if tc.v6only {
				env, wantLease = subnet.Env{MTU: 1430, IPMasq: tc.ipMasq}, netip.Prefix{}
			}
			if tc.dual || tc.v6only {
				wantLease6 = netip.MustParsePrefix("fd00:10:244:7::/64")
				env = env.WithIPv6(netip.MustParsePrefix("fd00:10:244::/48"), wantLease6)
			}
			d, err := Render(c, env)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if d.IPv6Lease != wantLease6 {
				t.Errorf("IPv6Lease = %s, want %s", d.IPv6Lease, wantLease6)
			}
			again, err := Render(c, env)
			if err != nil || !bytes.Equal(d.Config, again.Config) {
				t.Fatalf("Render is not deterministic: %s vs %s (%v)", d.Config, again.Config, err)
			}
			if d.Lease != wantLease {
				t.Errorf("Lease = %s, want %s", d.Lease, wantLease)
			}
			golden := filepath.Join("testdata", "render", tc.name+".json")
			if *update {
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, d.Config, "", "  "); err != nil {
					t.Fatal(err)
				}
				pretty.WriteByte('\n')
				if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			wantBytes, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden file (run with -update to create it): %v", err)
			}
			var want, got any
			if err := json.Unmarshal(wantBytes, &want); err != nil {
				t.Fatalf("golden %s: %v", golden, err)
			}
			if err := json.Unmarshal(d.Config, &got); err != nil {
				t.Fatalf("rendered config is not JSON: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rendered config differs from %s (-want +got):\n%s", golden, diff)
			}
			var typ struct {
				Type string `json:"type"`
			}
			_ = json.Unmarshal(d.Config, &typ)
			if d.Type != typ.Type {
				t.Errorf("Delegate.Type = %q, config type %q", d.Type, typ.Type)
			}
		})
	}
}

func TestRenderRejectsInvalidEnv(t *testing.T) {
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"n"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Render(c, subnet.Env{}); !errors.Is(err, subnet.ErrEnvInvalid) {
		t.Errorf("Render(zero Env) = %v, want ErrEnvInvalid", err)
	}
}

func TestRenderRejectsMalformedRawValues(t *testing.T) {
	c := &NetConf{CNIVersion: "1.1.0", Name: "n", DelegateType: "bridge",
		Delegate: map[string]json.RawMessage{"x": json.RawMessage(`{not json`)}}
	if _, err := Render(c, testEnv(true)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Render(malformed raw delegate value) = %v, want ErrInvalidConfig", err)
	}
}

// A user route of a family the host has no lease of cannot be routed from
// the pod: Render refuses it, naming the route.
func TestRenderRefusesRoutesOfAFamilyWithoutLease(t *testing.T) {
	v6route, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"dst":"10.0.0.0/8"},{"dst":"fd99::/64"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Render(v6route, testEnv(true)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "ipam.routes[1].dst fd99::/64") {
		t.Errorf("IPv6 route on an IPv4-only host: %v, want ErrInvalidConf naming ipam.routes[1]", err)
	}
	dual := testEnv(true).WithIPv6(netip.MustParsePrefix("fd00:10:244::/48"), netip.MustParsePrefix("fd00:10:244:7::/64"))
	if _, err := Render(v6route, dual); err != nil {
		t.Errorf("the same routes on a dual-stack host: %v", err)
	}
	v6only := subnet.Env{MTU: 1430}.WithIPv6(netip.MustParsePrefix("fd00:10:244::/48"), netip.MustParsePrefix("fd00:10:244:7::/64"))
	if _, err := Render(v6route, v6only); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "ipam.routes[0].dst 10.0.0.0/8") {
		t.Errorf("IPv4 route on an IPv6-only host: %v, want ErrInvalidConf naming ipam.routes[0]", err)
	}
}
