package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// badFlag is a wrong value for one flag of one command.
type badFlag struct {
	cmd   []string // the command, e.g. {"lease", "reserve", "10.244.9.0/24"}
	flag  string   // the flag's name
	value string
	want  string // in the error, besides the flag's name
}

// badFlags holds at least one wrong value for every flag of every command
// (TestEveryFlagHasABadValueCase keeps it complete).
var badFlags = []badFlag{
	{[]string{"lease", "list"}, "endpoints", "ftp://10.0.0.1:2379", `scheme "ftp"`},
	{[]string{"lease", "list"}, "endpoints", "", "want etcd endpoints such as http://127.0.0.1:2379"},
	{[]string{"lease", "list"}, "endpoints", "http://a:1,,http://b:2", "stray comma"},
	{[]string{"lease", "list"}, "endpoints", "10.0.0.1", "want host:port"},
	{[]string{"lease", "list"}, "prefix", "coreos.com/network", "starting with '/'"},
	{[]string{"lease", "list"}, "prefix", "/", "want an etcd key prefix"},
	{[]string{"lease", "list"}, "cacert", "/nonexistent/ca.pem", "--cacert /nonexistent/ca.pem"},
	{[]string{"lease", "list"}, "cert", "/nonexistent/cert.pem", "needs its private key: set --key"},
	{[]string{"lease", "list"}, "key", "/nonexistent/key.pem", "needs its certificate: set --cert"},
	{[]string{"lease", "list"}, "user", ":secret", "want name or name:password"},
	{[]string{"lease", "list"}, "user", "root", `user "root" has no password`},
	{[]string{"lease", "list"}, "password", "secret", "--password needs a user name: set --user NAME"},
	{[]string{"lease", "list"}, "dial-timeout", "soon", "want a duration such as 5s"},
	{[]string{"lease", "list"}, "dial-timeout", "0s", "want 1ms or more"},
	{[]string{"lease", "list"}, "write-out", "yaml", "want one of table, json, simple"},
	{[]string{"run"}, "iface", "bad/name", "want an interface name"},
	{[]string{"run"}, "iface", "nope0", "no such interface on this host"},
	{[]string{"run"}, "iface", "lo", "chooses lo, the loopback interface"},
	{[]string{"teardown"}, "iface", "lo", "chooses lo, the loopback interface"},
	{[]string{"run"}, "iface-can-reach", "127.0.0.1", "chooses lo, the loopback interface"},
	{[]string{"config", "put"}, "file", "/", "is a directory: want a config file"},
	{[]string{"config", "validate"}, "file", "/", "is a directory: want a config file"},
	{[]string{"run"}, "public-ip", "0.0.0.0", "is the unspecified address"},
	{[]string{"run"}, "public-ip", "224.0.0.1", "is a multicast address"},
	{[]string{"run"}, "public-ip", "::ffff:198.18.0.7", "want the host's IPv4 address"},
	{[]string{"run"}, "public-ip", "fe80::1%eth0", "want the host's IPv4 address"},
	{[]string{"run"}, "public-ip", "198.51.100.77", "is not an address of this host"},
	{[]string{"run"}, "public-ipv6", "198.18.0.7", "want the host's IPv6 address"},
	{[]string{"run"}, "public-ipv6", "fe80::1%eth0", "want the host's IPv6 address"},
	{[]string{"run"}, "public-ipv6", "ff02::1", "is a multicast address"},
	{[]string{"run"}, "public-ipv6", "2001:db8::77", "is not an address of this host"},
	{[]string{"run"}, "node-name", "bad/name", "may hold only letters"},
	{[]string{"run"}, "subnet-file", "relative/path", "want an absolute file path"},
	{[]string{"run"}, "subnet-file", "/", "want an absolute file path"},
	{[]string{"run"}, "log-format", "xml", "want one of text, json"},
	{[]string{"run"}, "log-level", "loud", "want one of debug, info, warn, error"},
	{[]string{"run"}, "lease-ttl", "5s", "want 10s or more"},
	{[]string{"run"}, "lease-ttl", "forever", "want a duration"},
	{[]string{"run"}, "kernel-resync", "0", "want 1s or more"},
	{[]string{"run"}, "lease-resync", "-5m", "want 1s or more"},
	{[]string{"run"}, "ip-masq", "maybe", "want true or false"},
	{[]string{"run"}, "vxlan-guard", "maybe", "want true or false"},
	{[]string{"run"}, "adopt-flannel", "yes please", "want true or false"},
	{[]string{"run"}, "flannel-subnet-file", "run/flannel/subnet.env", "want an absolute file path"},
	{[]string{"masquerade", "install"}, "net-config-path", "net-conf.json", "want an absolute file path"},
	{[]string{"run"}, "peer-probe", "often", "want true or false"},
	{[]string{"run"}, "peer-probe-sweep", "10ms", "want 100ms or more"},
	{[]string{"run"}, "peer-probe-sweep", "hourly", "want a duration"},
	{[]string{"run"}, "peer-probe-rate", "0", "want a whole number in 1..10000"},
	{[]string{"run"}, "peer-probe-rate", "2.5", "want a whole number in 1..10000"},
	{[]string{"run"}, "subnet-file-format", "FLANNEL_", "want one of overlay, flannel"},
	{[]string{"run"}, "health-addr", "bogus", "want host:port such as 127.0.0.1:9436"},
	{[]string{"run"}, "health-addr", "127.0.0.1:99999", "not 0..65535"},
	{[]string{"run"}, "health-addr", "example.com:9436", "not an IP address or localhost"},
	{[]string{"run"}, "health-addr", "192.0.2.1:9436", "192.0.2.1 is not an address of this host"},
	{[]string{"teardown"}, "iface", "nope0", "no such interface on this host"},
	{[]string{"teardown"}, "public-ip", "255.255.255.255", "the broadcast address"},
	{[]string{"teardown"}, "public-ipv6", "::", "is the unspecified address"},
	{[]string{"teardown"}, "public-ipv6", "2001:db8::77", "is not an address of this host"},
	{[]string{"teardown"}, "node-name", "a b", "may hold only letters"},
	{[]string{"teardown"}, "subnet-file", "subnet.env", "want an absolute file path"},
	{[]string{"teardown"}, "log-format", "yaml", "want one of text, json"},
	{[]string{"teardown"}, "log-level", "trace", "want one of debug"},
	{[]string{"teardown"}, "vni", "0", "want a whole number in 1..16777215"},
	{[]string{"teardown"}, "vni", "one", "want a whole number in 1..16777215"},
	{[]string{"teardown"}, "force", "perhaps", "want true or false"},
	{[]string{"teardown"}, "iface-regex", "(", "want a regular expression"},
	{[]string{"teardown"}, "iface-can-reach", "ff02::1", "want an IP address"},
	{[]string{"doctor"}, "iface", "nope0", "no such interface on this host"},
	{[]string{"doctor"}, "iface-regex", "(", "want a regular expression"},
	{[]string{"doctor"}, "iface-can-reach", "ff02::1", "want an IP address"},
	{[]string{"doctor"}, "public-ip", "255.255.255.255", "the broadcast address"},
	{[]string{"doctor"}, "public-ipv6", "::", "is the unspecified address"},
	{[]string{"doctor"}, "node-name", "a b", "may hold only letters"},
	{[]string{"doctor"}, "subnet-file", "subnet.env", "want an absolute file path"},
	{[]string{"doctor"}, "log-format", "yaml", "want one of text, json"},
	{[]string{"doctor"}, "log-level", "trace", "want one of debug"},
	{[]string{"doctor"}, "health-addr", "bogus", "want host:port such as 127.0.0.1:9436"},
	{[]string{"doctor"}, "cni-conf-dir", "etc/cni/net.d", "want an absolute directory path"},
	{[]string{"doctor"}, "cni-conf-dir", "/proc/self/status", "is not a directory"},
	// flanneld's flags (flanneld_flags.go): overlayd's of the same name,
	{[]string{"run"}, "iface", "fe80::1%eth0", "want an interface name"},
	{[]string{"run"}, "iface", "127.0.0.1", "is a loopback address"},
	{[]string{"run"}, "iface", "198.51.100.77", "no interface of this host holds this address"},
	{[]string{"run"}, "iface-regex", "[", "want a regular expression"},
	{[]string{"run"}, "iface-regex", "^nomatch$", "matches no interface's address or name"},
	{[]string{"run"}, "iface-can-reach", "0.0.0.0", "want an IP address"},
	{[]string{"run"}, "iface-can-reach", "fe80::1%eth0", "want an IP address"},
	// aliases of overlayd's flags,
	{[]string{"run"}, "etcd-endpoints", "ftp://10.0.0.1:2379", `scheme "ftp"`},
	{[]string{"run"}, "etcd-prefix", "coreos.com/network", "starting with '/'"},
	{[]string{"run"}, "etcd-cafile", "/nonexistent/ca.pem", "--cacert /nonexistent/ca.pem"},
	{[]string{"run"}, "etcd-certfile", "/nonexistent/cert.pem", "needs its private key: set --key"},
	{[]string{"run"}, "etcd-keyfile", "/nonexistent/key.pem", "needs its certificate: set --cert"},
	{[]string{"run"}, "etcd-username", "root:secret", "want a user name without ':'"},
	{[]string{"run"}, "etcd-username", "root", `user "root" has no password`},
	{[]string{"run"}, "etcd-password", "secret", "--password needs a user name"},
	{[]string{"run"}, "healthz-ip", "not-an-ip", "want an IP address"},
	{[]string{"run"}, "healthz-port", "99999", "want a whole number in 0..65535"},
	{[]string{"run"}, "healthz-port", "http", "want a whole number in 0..65535"},
	// Kube mode's (kube_flags.go), flanneld's names,
	{[]string{"run"}, "kube-subnet-mgr", "maybe", "want true or false"},
	{[]string{"run"}, "kube-api-url", "ftp://10.0.0.1:6443", "want the API server's URL such as https://10.0.0.1:6443"},
	{[]string{"run"}, "kube-api-url", "10.0.0.1:6443", "want the API server's URL"},
	{[]string{"run"}, "kubeconfig-file", "/nonexistent/kubeconfig", "want a readable file"},
	{[]string{"run"}, "kubeconfig-file", "/", "not a directory"},
	{[]string{"run"}, "kube-annotation-prefix", "a/b/c", "at most one '/'"},
	{[]string{"run"}, "kube-annotation-prefix", "Flannel.Example.com", "want a lower-case DNS name"},
	{[]string{"run"}, "set-node-network-unavailable", "perhaps", "want true or false"},
	{[]string{"run"}, "net-config-path", "net-conf.json", "want an absolute file path"},
	{[]string{"run", "--kube-subnet-mgr", "--node-name", "n1"}, "net-config-path", "/", "want an absolute file path"},
	// The settings of the other mode: --kube-subnet-mgr and etcd's, kube
	// mode's without it.
	{[]string{"run", "--kube-subnet-mgr", "--node-name", "n1"}, "prefix", "/example.com/network", "etcd's settings"},
	{[]string{"run", "--kube-subnet-mgr", "--node-name", "n1"}, "lease-ttl", "1h", "etcd's settings"},
	{[]string{"run", "--kube-subnet-mgr", "--node-name", "n1"}, "etcd-prefix", "/example.com/network", "etcd's settings"},
	{[]string{"run"}, "kube-api-url", "https://10.0.0.1:6443", "is kube mode's: add --kube-subnet-mgr"},
	{[]string{"run"}, "kube-annotation-prefix", "example.com/net", "is kube mode's: add --kube-subnet-mgr"},
	// doctor reads kube mode's leases with run's flags (but writes no
	// condition: no --set-node-network-unavailable).
	{[]string{"doctor"}, "kube-subnet-mgr", "maybe", "want true or false"},
	{[]string{"doctor"}, "kube-api-url", "10.0.0.1:6443", "want the API server's URL"},
	{[]string{"doctor"}, "kubeconfig-file", "/nonexistent/kubeconfig", "want a readable file"},
	{[]string{"doctor"}, "kube-annotation-prefix", "a/b/c", "at most one '/'"},
	{[]string{"doctor"}, "net-config-path", "net-conf.json", "want an absolute file path"},
	{[]string{"doctor"}, "net-config-path", "/etc/kube-overlay/net-conf.json", "is kube mode's: add --kube-subnet-mgr"},
	{[]string{"doctor", "--kube-subnet-mgr", "--node-name", "n1"}, "endpoints", "https://10.0.0.1:2379", "etcd's settings"},
	// and flags with no equivalent.
	{[]string{"run"}, "subnet-lease-renew-margin", "60", "--lease-ttl"},
	{[]string{"run"}, "iptables-resync", "5", "nftables"},
	{[]string{"run"}, "iptables-forward-rules", "true", "adds no forward rules"},
	{[]string{"run"}, "version", "true", "overlayd version"},
	{[]string{"run"}, "v", "2", "--log-level"},
	{[]string{"run"}, "vmodule", "main=2", "--log-level"},
	{[]string{"run"}, "log_backtrace_at", "main.go:1", "--log-level"},
	{[]string{"status"}, "health-addr", "", "want host:port"},
	{[]string{"status"}, "health-addr", "9436", "want host:port"},
	{[]string{"status"}, "peers", "all", "want true or false"},
	{[]string{"lease", "reserve", "10.244.9.0/24"}, "public-ip", "0.0.0.0", "is the unspecified address"},
	{[]string{"lease", "reserve", "10.244.9.0/24"}, "public-ip", "127.0.0.1", "is a loopback address"},
	{[]string{"lease", "reserve", "10.244.9.0/24"}, "public-ip", "host-7", "want the host's IPv4 address"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "node-name", "bad/name", "may hold only letters"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "public-ipv6", "198.18.0.9", "want the host's IPv6 address"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "public-ipv6", "::1", "is a loopback address"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "public-ipv6", "fe80::7", "is a link-local address"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "ipv6-subnet", "10.244.9.0/24", "want an IPv6 subnet such as fd00:10:244:7::/64"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "ipv6-subnet", "fd00:10:244:9::", "want an IPv6 subnet"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "ipv6-subnet", "fd00:10:244:9::1/64", "want a network address such as fd00:10:244:9::/64"},
	{[]string{"lease", "reserve", "10.244.9.0/24", "--public-ip", "198.18.0.9"}, "ipv6-subnet", "::ffff:10.0.0.0/120", "want an IPv6 subnet"},
	{[]string{"lease", "reserve", "10.244.0.0/24", "--public-ip", "198.18.0.9"}, "force", "sure", "want true or false"},
	{[]string{"lease", "revoke", "10.244.9.0/24"}, "force", "maybe", "want true or false"},
	{[]string{"lease", "revoke", "10.244.9.0/24"}, "dry-run", "2", "want true or false"},
	{[]string{"config", "get"}, "raw", "yes please", "want true or false"},
	{[]string{"config", "put"}, "file", "", "want a file name, or - for standard input"},
	{[]string{"install-cni"}, "cni-bin-dir", "opt/cni/bin", "want an absolute directory path"},
	{[]string{"install-cni"}, "cni-conf-dir", "/proc/self/status", "is not a directory"},
	{[]string{"install-cni"}, "plugin", "/nonexistent/overlay-cni", "want an executable file"},
	{[]string{"install-cni"}, "conflist", "/nonexistent/10-overlay.conflist", "want a CNI network config list file"},
	{[]string{"config", "put"}, "file", "/nonexistent/net.json", "cannot read it"},
	{[]string{"config", "put", "-f", "-"}, "force", "x", "want true or false"},
	{[]string{"config", "validate"}, "file", "", "want a file name"},
}

// countingListener stands in for etcd: a command that fails its flag
// checks must not connect to it.
func countingListener(t *testing.T) (endpoint string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return "http://" + ln.Addr().String(), accepted
}

// A bad value for any flag — on the command line or in its environment
// variable — is a usage error (exit 2) naming the flag (or variable) and
// what it accepts, before anything happens: no etcd connection, no file.
func TestEveryBadFlagValueIsAUsageErrorBeforeAnything(t *testing.T) {
	etcd, accepted := countingListener(t)
	dir := t.TempDir()
	for _, tc := range badFlags {
		name := strings.Join(tc.cmd, " ") + " --" + tc.flag + "=" + tc.value
		t.Run(name, func(t *testing.T) {
			subnetFile := filepath.Join(dir, "subnet.env")
			var base []string
			name := overlayName(tc.flag)
			if name != "endpoints" {
				ep := etcd
				if slices.Contains([]string{"cacert", "cert", "key"}, name) {
					ep = strings.Replace(ep, "http:", "https:", 1) // TLS files with a TLS endpoint
				}
				base = append(base, "--endpoints", ep)
			}
			if tc.flag != "dial-timeout" {
				base = append(base, "--dial-timeout", "2s")
			}
			args := append(append(base, tc.cmd...), "--"+tc.flag+"="+tc.value)
			if tc.cmd[0] == "run" || tc.cmd[0] == "teardown" || tc.cmd[0] == "doctor" {
				if tc.flag != "subnet-file" {
					args = append(args, "--subnet-file", subnetFile)
				}
				if !slices.Contains([]string{"iface", "iface-regex", "iface-can-reach", "public-ip"}, tc.flag) {
					args = append(args, "--iface", testIface(t))
				}
			}
			r := runEnv(t, nil, args...)
			if linkedKube == nil && slices.Contains(tc.cmd, "--kube-subnet-mgr") && r.code == exitError && r.err == "Error: "+errHandedOver.Error()+"\n" {
				return // overlayd hands it over; overlayd-kube refuses it (go test -tags kube)
			}
			if r.code != exitUsage || !strings.Contains(r.err, "--"+tc.flag) || !strings.Contains(r.err, tc.want) {
				t.Errorf("overlayd %s: exit %d, stderr %q; want exit 2 naming --%s and %q", strings.Join(args, " "), r.code, r.err, tc.flag, tc.want)
			}
			if strings.Count(strings.TrimSpace(r.err), "\n") != 1 { // Error: ... + Run '... --help'
				t.Errorf("want one error line and the help hint, got %q", r.err)
			}
			if (tc.flag == "user" || tc.flag == "password") && strings.Contains(r.err, "secret") {
				t.Errorf("the error shows a password: %q", r.err)
			}
			if _, err := os.Stat(subnetFile); err == nil {
				t.Errorf("%s was written", subnetFile)
			}
			for _, name := range variablesOf(lookupFlag(t, tc.cmd, tc.flag), tc.value) {
				// The same value from the environment fails the same way.
				envArgs := append(append([]string{}, base...), tc.cmd...)
				envArgs = append(envArgs, args[len(base)+len(tc.cmd)+1:]...)
				r := runEnv(t, []string{name + "=" + tc.value}, envArgs...)
				if r.code != exitUsage || !strings.Contains(r.err, name) || !strings.Contains(r.err, tc.want) {
					t.Errorf("%s=%q overlayd %s: exit %d, stderr %q; want exit 2 naming %s and %q", name, tc.value, strings.Join(envArgs, " "), r.code, r.err, name, tc.want)
				}
			}
		})
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("commands with bad flags connected to etcd %d times", n)
	}
}

// overlayName is the overlayd flag that flag sets: itself, or the one a
// flanneld name stands for.
func overlayName(flag string) string {
	for _, ff := range flanneldFlags {
		if ff.name == flag && ff.sets != "" {
			return ff.sets
		}
	}
	return flag
}

// variablesOf are the environment variables that set f to value: its
// OVERLAY_* and its FLANNELD_* variable (flanneld ignores an empty one).
func variablesOf(f *pflag.Flag, value string) []string {
	var names []string
	if readsEnv(f) {
		names = append(names, env(f.Name))
	}
	if v := f.Annotations[flanneldVarAnnotation]; v != nil && value != "" {
		names = append(names, v[0])
	}
	return names
}

// testIface is an interface of the test host that run and teardown accept
// as --iface: up, not the loopback (refused), with a global address. The
// tests that use it never get past the flags (or pass their own daemonRunner).
func testIface(t *testing.T) string {
	t.Helper()
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				return ifc.Name
			}
		}
	}
	t.Skip("this host has no interface other than the loopback with a global address")
	return ""
}

// runEnv runs the CLI in-process with exactly environ as its environment.
func runEnv(t *testing.T, environ []string, args ...string) cliResult {
	t.Helper()
	return runEnvWith(t, daemon.Run, environ, args...)
}

// errHandedOver is what testHandOver returns: the command would now run
// in overlayd-kube.
var errHandedOver = errors.New("handed over to " + KubeProgram)

// testHandOver stands in for overlayd's exec of overlayd-kube.
func testHandOver([]string) error { return errHandedOver }

// runEnvWith is runEnv with run standing in for the daemon.
func runEnvWith(t *testing.T, run daemonRunner, environ []string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	code := executeProgram(args, program{streams: streams{in: strings.NewReader(""), out: &out, err: &errOut}, environ: environ, runDaemon: run,
		kube: linkedKube, handOver: testHandOver})
	return cliResult{out.String(), errOut.String(), code}
}

func lookupFlag(t *testing.T, cmdArgs []string, name string) *pflag.Flag {
	t.Helper()
	root := newRootCommand(program{})
	c, _, err := root.Find(cmdArgs)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Flags().Lookup(name); f != nil {
		return f
	}
	return c.InheritedFlags().Lookup(name)
}

// Every flag of every command has a bad-value case above, so a new flag
// cannot skip validation unnoticed.
func TestEveryFlagHasABadValueCase(t *testing.T) {
	covered := map[string]bool{}
	for _, tc := range badFlags {
		path := tc.cmd[0]
		if tc.cmd[0] == "lease" || tc.cmd[0] == "config" || tc.cmd[0] == "masquerade" {
			path += " " + tc.cmd[1]
		}
		covered[path+" --"+tc.flag] = true
		covered["--"+tc.flag] = true // a global flag is covered once
	}
	root := newRootCommand(program{})
	walk(root, func(c *cobra.Command) {
		path := strings.TrimPrefix(c.CommandPath(), "overlayd ")
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if _, checked := f.Value.(checkedValue); !checked {
				t.Errorf("overlayd %s --%s has no check", path, f.Name)
			}
			if cobraOwn := f.Name == "help" || path == "help" || strings.HasPrefix(path, "completion"); !cobraOwn && !covered[path+" --"+f.Name] {
				t.Errorf("overlayd %s --%s has no bad-value case in badFlags", path, f.Name)
			}
		})
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) {
			if !covered["--"+f.Name] {
				t.Errorf("global flag --%s has no bad-value case in badFlags", f.Name)
			}
		})
	})
}

// Only the global flags and run's flags (which teardown and status share:
// the same host) come from the environment; safety flags never do.
func TestOnlyGlobalAndRunFlagsReadTheEnvironment(t *testing.T) {
	root := newRootCommand(program{})
	run, _, _ := root.Find([]string{"run"})
	runFlags := map[string]bool{}
	run.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { runFlags[f.Name] = f.Name != "help" && !isFlanneldOnly(f) }) // those read FLANNELD_* only
	walk(root, func(c *cobra.Command) {
		path := c.CommandPath()
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) {
			if !readsEnv(f) {
				t.Errorf("global flag --%s does not read %s", f.Name, env(f.Name))
			}
		})
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			switch shared := runFlags[f.Name] && slices.Contains([]string{"overlayd run", "overlayd teardown", "overlayd status", "overlayd doctor"}, path); {
			case shared && !readsEnv(f):
				t.Errorf("%s --%s does not read %s", path, f.Name, env(f.Name))
			case !shared && readsEnv(f):
				t.Errorf("%s --%s reads %s: only run's flags may", path, f.Name, env(f.Name))
			}
		})
	})
}

func TestUnknownEnvironmentVariablesAreWarnedAboutOnce(t *testing.T) {
	environ := []string{"OVERLAY_ENDPONTS=http://x:2379", "OVERLAY_FORCE=1", "OVERLAY_SUBNET=10.244.7.1/24", "OVERLAY_NODE_NAME=h1", "PATH=/bin"}
	r := runEnv(t, environ, "version")
	if r.code != exitOK {
		t.Fatalf("version: %+v", r)
	}
	want := "warning: ignoring OVERLAY_FORCE: --force is taken only from the command line\n" +
		"warning: ignoring unknown environment variable OVERLAY_ENDPONTS (overlayd reads OVERLAY_<FLAG> only for the global flags and run's flags)\n"
	if strings.Count(r.err, "OVERLAY_ENDPONTS") != 1 || !strings.Contains(r.err, "OVERLAY_FORCE: --force is taken only from the command line") ||
		strings.Contains(r.err, "OVERLAY_SUBNET") || strings.Contains(r.err, "OVERLAY_NODE_NAME") {
		t.Errorf("stderr = %q, want exactly:\n%s", r.err, want)
	}
}

// --node-name and lease reserve's node names are checked by
// subnet.CheckNodeID; the daemon's NodeID must accept exactly the same
// names, or the CLI would accept what the daemon rejects.
func TestNodeNameRuleIsTheDaemons(t *testing.T) {
	for _, name := range []string{"h1", "worker-7.example_com", "bad/name", "a b", "é", "x:y", strings.Repeat("a", 253), strings.Repeat("a", 254)} {
		_, derr := daemon.NodeID(name, "/nonexistent/machine-id")
		if cerr := nodeName(name); (derr == nil) != (cerr == nil) {
			t.Errorf("node name %q: daemon says %v, CLI says %v", name, derr, cerr)
		}
	}
}

// -w takes its value in any case, as its flag check does: the check and
// the printer never disagree about a value.
func TestWriteOutIgnoresCase(t *testing.T) {
	config := `{"Network":"10.1.0.0/16"}`
	for _, tc := range []struct {
		args    []string
		environ []string
		want    string
	}{
		{[]string{"-w", "JSON"}, nil, `"Network": "10.1.0.0/16"`},
		{[]string{"--write-out=Simple"}, nil, "Network 10.1.0.0/16\n"},
		{nil, []string{"OVERLAY_WRITE_OUT=TABLE"}, "FIELD"},
	} {
		args := append(tc.args, "config", "validate", "-f", "-")
		var out, errOut bytes.Buffer
		code := executeEnv(args, tc.environ, strings.NewReader(config), &out, &errOut)
		if code != exitOK || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v overlayd %s: exit %d, stdout %q, stderr %q; want %q", tc.environ, strings.Join(args, " "), code, out.String(), errOut.String(), tc.want)
		}
	}
}
