package delegate

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/subnet"
)

func TestParseConfDefaults(t *testing.T) {
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni"}`))
	if err != nil {
		t.Fatalf("ParseConf: %v", err)
	}
	want := &NetConf{
		CNIVersion:   "1.1.0",
		Name:         "overlay",
		SubnetFile:   "/run/overlay/subnet.env",
		DataDir:      "/var/lib/cni/overlay",
		HealthAddr:   "127.0.0.1:9436",
		DelegateType: "bridge",
		Delegate:     map[string]json.RawMessage{},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if got, want := c.HostLocalDir(), "/var/lib/cni/networks/overlay"; got != want {
		t.Errorf("HostLocalDir() = %q, want %q", got, want)
	}
}

func TestParseConfFields(t *testing.T) {
	c, err := ParseConf([]byte(`{
		"cniVersion":"1.0.0","name":"pods","type":"overlay-cni",
		"subnetFile":"/tmp/x/../subnet.env","dataDir":"/data/","healthAddr":"[::1]:19436",
		"delegate":{"type":"my-bridge","hairpinMode":true,"name":"ignored","cniVersion":"0.1.0",
		            "prevResult":{},"cni.dev/foo":1,"bridge":null,"ipam":{"dataDir":"/hl"}},
		"runtimeConfig":{"mac":"0e:00:00:00:00:01"},
		"args":{"cni":{"ips":["10.244.7.9"]}},
		"prevResult":{"cniVersion":"1.0.0"},
		"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],
		"cni.dev/attachments":[{"containerID":"b","ifname":"eth1"}]
	}`))
	if err != nil {
		t.Fatalf("ParseConf: %v", err)
	}
	want := &NetConf{
		CNIVersion:          "1.0.0",
		Name:                "pods",
		SubnetFile:          "/tmp/subnet.env",
		DataDir:             "/data",
		HealthAddr:          "[::1]:19436",
		DelegateType:        "my-bridge",
		Delegate:            map[string]json.RawMessage{"hairpinMode": json.RawMessage(`true`)},
		IPAM:                map[string]json.RawMessage{"dataDir": json.RawMessage(`"/hl"`)},
		RuntimeConfig:       json.RawMessage(`{"mac":"0e:00:00:00:00:01"}`),
		Args:                json.RawMessage(`{"cni":{"ips":["10.244.7.9"]}}`),
		PrevResult:          json.RawMessage(`{"cniVersion":"1.0.0"}`),
		ValidAttachments:    []types.GCAttachment{{ContainerID: "a", IfName: "eth0"}, {ContainerID: "b", IfName: "eth1"}},
		HasValidAttachments: true,
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	if got, want := c.HostLocalDir(), "/hl/pods"; got != want {
		t.Errorf("HostLocalDir() = %q, want %q", got, want)
	}
}

func TestParseConfEmptyValidAttachments(t *testing.T) {
	c, err := ParseConf([]byte(`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[]}`))
	if err != nil {
		t.Fatalf("ParseConf: %v", err)
	}
	if !c.HasValidAttachments || len(c.ValidAttachments) != 0 {
		t.Errorf("HasValidAttachments=%v ValidAttachments=%v, want true and empty", c.HasValidAttachments, c.ValidAttachments)
	}
}

func TestParseConfRejects(t *testing.T) {
	for _, tc := range []struct{ name, conf string }{
		{"not JSON", `{`},
		{"not an object", `[]`},
		{"no cniVersion", `{"name":"n"}`},
		{"no name", `{"cniVersion":"1.1.0"}`},
		{"name with slash", `{"cniVersion":"1.1.0","name":"a/b"}`},
		{"name with dots", `{"cniVersion":"1.1.0","name":"a..b"}`},
		{"name not a string", `{"cniVersion":"1.1.0","name":5}`},
		{"relative subnetFile", `{"cniVersion":"1.1.0","name":"n","subnetFile":"subnet.env"}`},
		{"empty dataDir", `{"cniVersion":"1.1.0","name":"n","dataDir":""}`},
		{"dataDir with NUL", `{"cniVersion":"1.1.0","name":"n","dataDir":"/a\u0000b"}`},
		{"delegate not an object", `{"cniVersion":"1.1.0","name":"n","delegate":"bridge"}`},
		{"delegate type path", `{"cniVersion":"1.1.0","name":"n","delegate":{"type":"../bin/sh"}}`},
		{"delegate type absolute", `{"cniVersion":"1.1.0","name":"n","delegate":{"type":"/bin/sh"}}`},
		{"delegate type not string", `{"cniVersion":"1.1.0","name":"n","delegate":{"type":1}}`},
		{"delegate bridge not string", `{"cniVersion":"1.1.0","name":"n","delegate":{"bridge":true}}`},
		{"ipam twice", `{"cniVersion":"1.1.0","name":"n","ipam":{},"delegate":{"ipam":{}}}`},
		{"ipam not an object", `{"cniVersion":"1.1.0","name":"n","ipam":[]}`},
		{"ipam dataDir relative", `{"cniVersion":"1.1.0","name":"n","ipam":{"dataDir":"x"}}`},
		{"routes not a list", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":{}}}`},
		{"route without dst", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"gw":"10.0.0.1"}]}}`},
		{"route null", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[null]}}`},
		{"route bad dst", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"dst":"10.0.0.0"}]}}`},
		{"route IPv4-mapped dst", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"dst":"::ffff:10.0.0.0/104"}]}}`},
		{"route gw of the other family", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"dst":"fd00::/64","gw":"10.0.0.1"}]}}`},
		{"route bad gw", `{"cniVersion":"1.1.0","name":"n","ipam":{"routes":[{"dst":"10.0.0.0/8","gw":"x"}]}}`},
		{"runtimeConfig not an object", `{"cniVersion":"1.1.0","name":"n","runtimeConfig":1}`},
		{"prevResult not an object", `{"cniVersion":"1.1.0","name":"n","prevResult":"x"}`},
		{"healthAddr not loopback", `{"cniVersion":"1.1.0","name":"n","healthAddr":"10.0.0.1:9436"}`},
		{"healthAddr without port", `{"cniVersion":"1.1.0","name":"n","healthAddr":"127.0.0.1"}`},
		{"healthAddr a name", `{"cniVersion":"1.1.0","name":"n","healthAddr":"localhost:9436"}`},
		{"healthAddr not a string", `{"cniVersion":"1.1.0","name":"n","healthAddr":9436}`},
		{"valid-attachments not a list", `{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConf([]byte(tc.conf))
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseConf(%s) = %v, want an error wrapping ErrInvalidConfig", tc.conf, err)
			}
		})
	}
}

// FuzzParseConf: parsing never panics, and whatever parses renders into a
// delegate configuration whose contract fields are overlay-cni's.
func FuzzParseConf(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`,
		`{"cniVersion":"0.3.1","name":"n","ipam":{"routes":[{"dst":"0.0.0.0/0"}],"subnet":"1.2.3.0/24"},"delegate":{"mtu":1400}}`,
		`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`,
		`{"cniVersion":"1.1.0","name":"n","runtimeConfig":{"mac":"x"},"args":{},"delegate":{"ipam":{"dataDir":"/x"}}}`,
		`{"cniVersion":"1.1.0","name":"n","delegate":null,"ipam":null}`,
		`{}`, `null`, `[]`, ``,
		// Aliases of the keys overlay-cni owns (refused; see TestConfRejectsKeyAliases).
		`{"cniVersion":"1.1.0","name":"n","delegate":{"cniversion":"0.1.0","Name":"x","TYPE":"y"}}`,
		`{"cniVersion":"1.1.0","name":"n","ipam":{"rangeſ":[[{"subnet":"192.0.2.0/24"}]],"datadir":"/x"}}`,
	} {
		f.Add([]byte(seed))
	}
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, true)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConf(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		d, err := Render(c, env)
		if err != nil {
			t.Fatalf("ParseConf accepted %q but Render failed: %v", data, err)
		}
		var out struct {
			Name       string `json:"name"`
			CNIVersion string `json:"cniVersion"`
			Type       string `json:"type"`
			IPAM       struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]any      `json:"routes"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(d.Config, &out); err != nil {
			t.Fatalf("rendered config is not JSON: %v\n%s", err, d.Config)
		}
		if out.Name != c.Name || out.CNIVersion != c.CNIVersion || out.Type != d.Type || out.IPAM.Type != "host-local" {
			t.Fatalf("rendered contract fields wrong: %s", d.Config)
		}
		if len(out.IPAM.Ranges) != 1 || len(out.IPAM.Ranges[0]) != 1 || out.IPAM.Ranges[0][0]["subnet"] != "10.244.7.0/24" {
			t.Fatalf("rendered ranges are not the lease: %s", d.Config)
		}
		if len(out.IPAM.Routes) == 0 || out.IPAM.Routes[0]["dst"] != "10.244.0.0/16" {
			t.Fatalf("first route is not the cluster network: %s", d.Config)
		}
	})
}
