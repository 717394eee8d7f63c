package main

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
)

// runConfig runs `overlayd` with args and environ up to the point where
// run would start the daemon, and returns the Config it would start it
// with (without its logger).
func runConfig(t *testing.T, environ []string, args ...string) (daemon.Config, cliResult) {
	t.Helper()
	var got daemon.Config
	r := runEnvWith(t, func(_ context.Context, cfg daemon.Config) error {
		cfg.Logger = nil
		got = cfg
		return nil
	}, environ, args...)
	return got, r
}

func mustRunConfig(t *testing.T, environ []string, args ...string) (daemon.Config, string) {
	t.Helper()
	cfg, r := runConfig(t, environ, args...)
	if r.code != exitOK {
		t.Fatalf("overlayd %s (environment %q): exit %d, stderr %q", strings.Join(args, " "), environ, r.code, r.err)
	}
	return cfg, r.err
}

// flanneld's names — as flags, single-dash flags and FLANNELD_* variables
// — build exactly the Config overlayd's own names do.
func TestFlanneldNamesBuildTheSameConfig(t *testing.T) {
	pki := etcdtest.NewPKI(t)
	subnetFile := filepath.Join(t.TempDir(), "subnet.env")
	const eps = "https://127.0.0.1:2379,https://127.0.0.2:2379"
	want, _ := mustRunConfig(t, nil, "run", "--endpoints", eps, "--prefix", "/example.com/network",
		"--cacert", pki.CACert, "--cert", pki.ClientCert, "--key", pki.ClientKey, "--user", "flannel", "--password", "s3cret",
		"--iface", testIface(t), "--subnet-file", subnetFile, "--ip-masq=false", "--health-addr", "127.0.0.1:8471")
	if want.Etcd.Username != "flannel" || want.HealthAddr != "127.0.0.1:8471" || want.Iface != testIface(t) || want.IPMasq {
		t.Fatalf("overlayd's names gave %+v", want)
	}
	flanneld := []string{"--etcd-endpoints", eps, "--etcd-prefix", "/example.com/network",
		"--etcd-cafile", pki.CACert, "--etcd-certfile", pki.ClientCert, "--etcd-keyfile", pki.ClientKey,
		"--etcd-username", "flannel", "--etcd-password", "s3cret",
		"--iface", testIface(t), "--subnet-file", subnetFile, "--ip-masq=false", "--healthz-ip", "127.0.0.1", "--healthz-port", "8471"}
	var singleDash []string
	for i := 0; i < len(flanneld); i += 2 {
		if strings.Contains(flanneld[i], "=") {
			singleDash = append(singleDash, flanneld[i][1:])
			i--
			continue
		}
		singleDash = append(singleDash, flanneld[i][1:]+"="+flanneld[i+1])
	}
	var environ []string
	for i := 0; i < len(flanneld); i += 2 {
		name, value, ok := strings.Cut(strings.TrimPrefix(flanneld[i], "--"), "=")
		if !ok {
			value = flanneld[i+1]
		} else {
			i--
		}
		environ = append(environ, flanneldVar(name)+"="+value)
	}
	for name, tc := range map[string]struct {
		environ, args []string
	}{
		"flags":                {nil, append([]string{"run"}, flanneld...)},
		"single-dash flags":    {nil, append([]string{"run"}, singleDash...)},
		"FLANNELD_* variables": {environ, []string{"run"}},
	} {
		got, warnings := mustRunConfig(t, tc.environ, tc.args...)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Config\n%+v\nwant (overlayd's names)\n%+v", name, got, want)
		}
		if warnings != "" {
			t.Errorf("%s: stderr %q", name, warnings)
		}
	}
}

// The command line wins over both variables, OVERLAY_* over FLANNELD_*
// (with a warning); flanneld's name and overlayd's on one command line
// conflict.
func TestFlanneldPrecedence(t *testing.T) {
	base := []string{"--subnet-file", filepath.Join(t.TempDir(), "subnet.env")}
	const a, b, c = "http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"
	for _, tc := range []struct {
		name          string
		environ, args []string
		want          []string // endpoints
		warning       string
	}{
		{"FLANNELD_* alone", []string{"FLANNELD_ETCD_ENDPOINTS=" + b}, nil, []string{b}, ""},
		{"OVERLAY_* wins", []string{"OVERLAY_ENDPOINTS=" + a, "FLANNELD_ETCD_ENDPOINTS=" + b}, nil, []string{a},
			"warning: ignoring FLANNELD_ETCD_ENDPOINTS: OVERLAY_ENDPOINTS is set too, and wins"},
		{"flanneld's flag over OVERLAY_*", []string{"OVERLAY_ENDPOINTS=" + a}, []string{"--etcd-endpoints", c}, []string{c}, ""},
		{"overlayd's flag over FLANNELD_*", []string{"FLANNELD_ETCD_ENDPOINTS=" + b}, []string{"--endpoints", c}, []string{c}, ""},
		{"flanneld's flag over FLANNELD_*", []string{"FLANNELD_ETCD_ENDPOINTS=" + b}, []string{"--etcd-endpoints", c}, []string{c}, ""},
		{"an empty FLANNELD_* sets nothing", []string{"FLANNELD_ETCD_ENDPOINTS="}, nil, []string{"http://127.0.0.1:2379"}, ""},
	} {
		cfg, r := runConfig(t, tc.environ, append(append([]string{"run", "--iface", testIface(t)}, base...), tc.args...)...)
		if r.code != exitOK || !slices.Equal(cfg.Etcd.Endpoints, tc.want) || strings.TrimSpace(r.err) != tc.warning {
			t.Errorf("%s: exit %d, endpoints %v, stderr %q; want %v and stderr %q", tc.name, r.code, cfg.Etcd.Endpoints, r.err, tc.want, tc.warning)
		}
	}

	cfg, r := runConfig(t, []string{"OVERLAY_IFACE=" + testIface(t), "FLANNELD_IFACE=nope0"}, append([]string{"run"}, base...)...)
	if r.code != exitOK || cfg.Iface != testIface(t) || !strings.Contains(r.err, "warning: ignoring FLANNELD_IFACE: OVERLAY_IFACE is set too, and wins") {
		t.Errorf("OVERLAY_IFACE and FLANNELD_IFACE: exit %d, iface %q, stderr %q", r.code, cfg.Iface, r.err)
	}

	for _, args := range [][]string{
		{"--etcd-endpoints", a, "--endpoints", b},
		{"--endpoints", b, "--etcd-endpoints", a},
		{"--health-addr", "127.0.0.1:9436", "--healthz-port", "8471"},
	} {
		r := runEnv(t, nil, append(append([]string{"run", "--iface", testIface(t)}, base...), args...)...)
		if r.code != exitUsage || !strings.Contains(r.err, "is flanneld's name for") {
			t.Errorf("overlayd run %s: exit %d, stderr %q; want exit 2: a conflict", strings.Join(args, " "), r.code, r.err)
		}
	}
}

// --ip-masq keeps overlayd's default (true) unless it is given, by any
// name; --healthz-ip/--healthz-port mean what they mean to flanneld once
// either is given (port 0: no health server), else --health-addr's
// default stands.
func TestFlanneldDefaults(t *testing.T) {
	base := []string{"run", "--iface", testIface(t), "--subnet-file", filepath.Join(t.TempDir(), "subnet.env")}
	for _, tc := range []struct {
		environ, args []string
		masq          bool
		health        string
		warning       string
	}{
		{nil, nil, true, daemon.DefaultHealthAddr, ""},
		{[]string{"FLANNELD_IP_MASQ=false"}, nil, false, daemon.DefaultHealthAddr, ""},
		{[]string{"FLANNELD_IP_MASQ=true"}, []string{"--ip-masq=false"}, false, daemon.DefaultHealthAddr, ""},
		{nil, []string{"-ip-masq"}, true, daemon.DefaultHealthAddr, ""},
		{nil, []string{"--healthz-port", "8471"}, true, "0.0.0.0:8471", ""},
		{[]string{"FLANNELD_HEALTHZ_PORT=8471"}, []string{"--healthz-ip", "127.0.0.1"}, true, "127.0.0.1:8471", ""},
		{nil, []string{"--healthz-ip", "127.0.0.1"}, true, "", "warning: no health server"},
		{nil, []string{"--healthz-port=0"}, true, "", "warning: no health server"},
		{[]string{"OVERLAY_HEALTH_ADDR=127.0.0.1:9437", "FLANNELD_HEALTHZ_PORT=8471"}, nil, true, "127.0.0.1:9437",
			"warning: ignoring FLANNELD_HEALTHZ_PORT: OVERLAY_HEALTH_ADDR is set too, and wins"},
		{nil, []string{"--kube-subnet-mgr=false", "--iptables-forward-rules=false"}, true, daemon.DefaultHealthAddr, ""},
	} {
		cfg, r := runConfig(t, tc.environ, append(append([]string{}, base...), tc.args...)...)
		if r.code != exitOK || cfg.IPMasq != tc.masq || cfg.HealthAddr != tc.health || !strings.HasPrefix(r.err, tc.warning) || (tc.warning == "") != (r.err == "") {
			t.Errorf("%q overlayd %s: exit %d, IPMasq %v, HealthAddr %q, stderr %q; want %v, %q, stderr %q",
				tc.environ, strings.Join(tc.args, " "), r.code, cfg.IPMasq, cfg.HealthAddr, r.err, tc.masq, tc.health, tc.warning)
		}
	}
}

// flanneld's --iface takes several values, tried in order; then
// --iface-regex, then --iface-can-reach.
func TestFlanneldInterfaceSelection(t *testing.T) {
	base := []string{"run", "--subnet-file", filepath.Join(t.TempDir(), "subnet.env")}
	for _, args := range [][]string{
		{"--iface", "nope0", "--iface", testIface(t)},
		{"--iface", "nope0", "--iface-regex", "^nothing", "--iface-regex", "^" + testIface(t) + "$"},
		{"-iface=nope0", "-iface-regex=^" + testIface(t) + "$"},
	} {
		cfg, r := runConfig(t, nil, append(append([]string{}, base...), args...)...)
		if r.code != exitOK || cfg.Iface != testIface(t) {
			t.Errorf("overlayd run %s: exit %d, iface %q, stderr %q; want %s", strings.Join(args, " "), r.code, cfg.Iface, r.err, testIface(t))
		}
	}
	// The route to 127.0.0.1 leaves by lo: not an underlay.
	r := runEnv(t, []string{"FLANNELD_IFACE_CAN_REACH=127.0.0.1"}, base...)
	if r.code != exitUsage || !strings.Contains(r.err, "--iface-can-reach 127.0.0.1: chooses lo, the loopback interface") ||
		!strings.Contains(r.err, "FLANNELD_IFACE_CAN_REACH") {
		t.Errorf("--iface-can-reach 127.0.0.1: exit %d, stderr %q", r.code, r.err)
	}
}

func TestFlanneldSingleDashArgs(t *testing.T) {
	in := []string{"run", "-etcd-endpoints=http://e:2379", "-iface", "eth0", "-ip-masq", "-v=2", "-w", "json", "--", "-iface"}
	want := []string{"run", "--etcd-endpoints=http://e:2379", "--iface", "eth0", "--ip-masq", "-v=2", "-w", "json", "--", "-iface"}
	if got := flanneldArgs(in); !slices.Equal(got, want) {
		t.Errorf("flanneldArgs(%q) = %q, want %q", in, got, want)
	}
}

// Every flag of flanneld's table is on run, reads its FLANNELD_* variable,
// and only overlayd's names show in run's help; other commands have none.
func TestFlanneldFlagsAreRunsOnly(t *testing.T) {
	root := newRootCommand(program{})
	run, _, _ := root.Find([]string{"run"})
	for _, ff := range flanneldFlags {
		f := run.Flags().Lookup(ff.name)
		if f == nil {
			t.Errorf("run has no --%s", ff.name)
			continue
		}
		if v := f.Annotations[flanneldVarAnnotation]; len(v) != 1 || v[0] != flanneldVar(ff.name) {
			t.Errorf("--%s reads %v, want %s", ff.name, v, flanneldVar(ff.name))
		}
		if f.Hidden != isFlanneldOnly(f) {
			t.Errorf("--%s: hidden %v", ff.name, f.Hidden)
		}
	}
	walk(root, func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if c != run && f.Annotations[flanneldVarAnnotation] != nil {
				t.Errorf("%s --%s reads %v: only run reads FLANNELD_*", c.CommandPath(), f.Name, f.Annotations[flanneldVarAnnotation])
			}
		})
	})
	if !strings.Contains(run.Long, "flanneld's flags") {
		t.Errorf("run's help does not mention flanneld's flags")
	}
}

func TestFlanneldVariablesAreWarnedAbout(t *testing.T) {
	r := runEnv(t, []string{"FLANNELD_SUBNET_DIR=/run/flannel/networks", "OVERLAY_ETCD_ENDPOINTS=http://x:2379"}, "run", "--iface", "nope0")
	for _, want := range []string{
		"warning: ignoring FLANNELD_SUBNET_DIR: flanneld v0.28 has no such flag, nor has overlayd",
		"warning: ignoring unknown environment variable OVERLAY_ETCD_ENDPOINTS",
	} {
		if !strings.Contains(r.err, want) {
			t.Errorf("stderr %q lacks %q", r.err, want)
		}
	}
	// Other commands do not read FLANNELD_* variables at all.
	if r := runEnv(t, []string{"FLANNELD_SUBNET_DIR=/x", "FLANNELD_KUBE_SUBNET_MGR=true"}, "version"); r.code != exitOK || r.err != "" {
		t.Errorf("version with FLANNELD_* variables: %+v", r)
	}
}
