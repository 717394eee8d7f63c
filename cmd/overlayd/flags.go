package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag value is checked when it is set — from the command line or
// the environment, before any command runs — by a check that says what
// the flag accepts. A failed check is a usage error (exit 2).

// checkedValue runs check before setting the flag's value.
type checkedValue struct {
	pflag.Value
	check func(string) error
}

func (v checkedValue) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	if err := v.Value.Set(s); err != nil {
		return errors.New("invalid value") // check accepted what the flag cannot parse: a bug
	}
	return nil
}

// checkFlag attaches check to the flag name of fs.
func checkFlag(fs *pflag.FlagSet, name string, check func(string) error) {
	f := fs.Lookup(name)
	f.Value = checkedValue{f.Value, check}
}

// flagError turns pflag's "invalid argument" into the flag, the value and
// what the flag accepts.
func flagError(_ *cobra.Command, err error) error {
	var inv *pflag.InvalidValueError
	if errors.As(err, &inv) {
		return usagef("--%s %s: %v", inv.GetFlag().Name, shown(inv.GetFlag().Name, inv.GetValue()), errors.Unwrap(inv))
	}
	return usageError{err}
}

// shown quotes a flag's value for an error message, except a secret's.
func shown(flag, value string) string {
	if slices.Contains([]string{"user", "password", "etcd-username", "etcd-password"}, flag) {
		return "(value not shown)"
	}
	return strconv.Quote(value)
}

// The checks. Each returns what the flag wants, in the user's words.

func durationAtLeast(least time.Duration) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 5s, 2m or 24h")
		}
		if d < least {
			return fmt.Errorf("want %s or more", least)
		}
		return nil
	}
}

func oneOf(values ...string) func(string) error {
	return func(s string) error {
		if !slices.Contains(values, strings.ToLower(s)) {
			return fmt.Errorf("want one of %s", strings.Join(values, ", "))
		}
		return nil
	}
}

func boolean(s string) error {
	if _, err := strconv.ParseBool(s); err != nil {
		return errors.New("want true or false")
	}
	return nil
}

func intIn(lo, hi int) func(string) error {
	return func(s string) error {
		if n, err := strconv.Atoi(s); err != nil || n < lo || n > hi {
			return fmt.Errorf("want a whole number in %d..%d", lo, hi)
		}
		return nil
	}
}

// hostIPv4 accepts a host's underlay address: what the daemon accepts as
// a lease's PublicIP.
func hostIPv4(s string) error {
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() {
		return errors.New("want the host's IPv4 address, such as 198.18.0.7")
	}
	return subnet.CheckVTEPAddr(ip)
}

// hostIP accepts run's and teardown's --public-ip: the host's IPv4
// underlay address, or its IPv6 one, which hostFlags.config takes as
// --public-ipv6 (the shipped DaemonSet passes Kubernetes' status.hostIP,
// which is the node's IPv6 address on an IPv6-only cluster).
func hostIP(s string) error {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Is4In6() || ip.Zone() != "" {
		return errors.New("want the host's IPv4 address, such as 198.18.0.7 (or its IPv6 address, taken as --public-ipv6)")
	}
	return subnet.CheckVTEPAddr(ip)
}

// hostIPv6 accepts a host's IPv6 underlay address: what the daemon
// accepts as a lease's PublicIPv6.
func hostIPv6(s string) error {
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is6() || ip.Is4In6() || ip.Zone() != "" {
		return errors.New("want the host's IPv6 address, such as 2001:db8::7")
	}
	return subnet.CheckVTEPAddr(ip)
}

// ipv6SubnetArg accepts an IPv6 subnet in CIDR form with no host bits;
// whether it fits the network is checked against the network config.
func ipv6SubnetArg(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return errors.New("want an IPv6 subnet such as fd00:10:244:7::/64")
	}
	if p != p.Masked() {
		return fmt.Errorf("want a network address such as %s", p.Masked())
	}
	return nil
}

// nodeName accepts what the daemon accepts as a node ID ("" is the
// default: no node name).
func nodeName(s string) error {
	if s == "" {
		return nil
	}
	return subnet.CheckNodeID(s)
}

// ifaceName accepts a Linux interface name; whether it exists is checked
// by the commands that use it.
func ifaceName(s string) error {
	if s == "" {
		return nil
	}
	if len(s) > 15 || s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n") {
		return errors.New("want an interface name such as eth0 (at most 15 characters, no '/', ':' or spaces)")
	}
	return nil
}

// listenAddr accepts host:port with an IP address or localhost as host
// (and "" when allowEmpty: disabled).
func listenAddr(allowEmpty bool) func(string) error {
	return func(s string) error {
		if s == "" && allowEmpty {
			return nil
		}
		want := "want host:port such as " + daemon.DefaultHealthAddr
		if allowEmpty {
			want += `, or "" to disable`
		}
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			return errors.New(want)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("%s (port %q is not 0..65535)", want, port)
		}
		if _, err := netip.ParseAddr(host); err != nil && host != "" && host != "localhost" {
			return fmt.Errorf("%s (host %q is not an IP address or localhost)", want, host)
		}
		return nil
	}
}

func absFile(s string) error {
	if !filepath.IsAbs(s) || strings.HasSuffix(s, "/") {
		return errors.New("want an absolute file path such as " + subnet.DefaultEnvFile)
	}
	if fi, err := os.Stat(s); err == nil && fi.IsDir() {
		return errors.New("is a directory: want a file path such as " + subnet.DefaultEnvFile)
	}
	return nil
}

func keyPrefix(s string) error {
	if !strings.HasPrefix(s, "/") || strings.Trim(s, "/") == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("want an etcd key prefix such as /coreos.com/network (starting with '/', no spaces)")
	}
	return nil
}

func userName(s string) error {
	if name, _, _ := strings.Cut(s, ":"); s != "" && name == "" {
		return errors.New("want name or name:password")
	}
	return nil
}

func inputFile(s string) error {
	if s == "" {
		return errors.New("want a file name, or - for standard input")
	}
	if fi, err := os.Stat(s); s != "-" && err == nil && fi.IsDir() {
		return errors.New("is a directory: want a config file (JSON), or - for standard input")
	}
	return nil
}

// addrValue is a flag holding an IP address, parsed when it is set (after
// its check) and kept typed; "" unsets it.
type addrValue struct{ addr *netip.Addr }

func (v addrValue) Set(s string) error {
	if s == "" {
		*v.addr = netip.Addr{}
		return nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return err
	}
	*v.addr = ip
	return nil
}

func (v addrValue) String() string {
	if !v.addr.IsValid() {
		return ""
	}
	return v.addr.String()
}

func (v addrValue) Type() string { return "string" } // as --help always showed it

// endpointsValue is --endpoints: comma-separated etcd URLs, each checked
// as the etcd client will read it.
type endpointsValue struct {
	eps     *[]string
	changed bool
}

func (v *endpointsValue) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("want etcd endpoints such as http://127.0.0.1:2379 (comma-separated)")
	}
	var eps []string
	for _, ep := range strings.Split(s, ",") {
		ep = strings.TrimSpace(ep)
		if err := etcdclient.CheckEndpoint(ep); err != nil {
			return fmt.Errorf("endpoint %q: %v; want URLs such as http://127.0.0.1:2379, https://host:2379 or unix:///path", ep, err)
		}
		eps = append(eps, ep)
	}
	if !v.changed {
		*v.eps = nil
	}
	*v.eps, v.changed = append(*v.eps, eps...), true
	return nil
}

func (v *endpointsValue) String() string { return strings.Join(*v.eps, ",") }
func (v *endpointsValue) Type() string   { return "urls" }

// Environment variables. A flag marked with envAnnotation is also read
// from OVERLAY_<FLAG>: the global flags, and run's flags — which teardown
// and status share, as they describe the same host. Every other flag
// (--force, --dry-run, lease reserve's --public-ip ...) comes only from the
// command line: a variable meant for one command must never change what
// another does.

const envAnnotation = "overlay-env"

// fromEnv marks flags of fs as read from the environment.
func fromEnv(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if err := fs.SetAnnotation(n, envAnnotation, []string{"yes"}); err != nil {
			panic(err) // a flag name typo: caught by every test
		}
	}
}

// annotations are the first values of annotation key on the flags names
// of fs that carry it.
func annotations(fs *pflag.FlagSet, key string, names []string) []string {
	var vals []string
	for _, n := range names {
		if f := fs.Lookup(n); f != nil && f.Annotations[key] != nil {
			vals = append(vals, f.Annotations[key][0])
		}
	}
	return vals
}

func readsEnv(f *pflag.Flag) bool { return f.Annotations[envAnnotation] != nil }

// setFromEnv marks a flag whose value came from the environment.
const setFromEnv = "overlay-set-from-env"

// envNote names the variables that set any of the flags names of fs, for
// an error about those flags: the user set no such flag.
func envNote(fs *pflag.FlagSet, names ...string) string {
	vars := annotations(fs, setFromEnv, names)
	if len(vars) == 0 {
		return flanneldNote(fs, names...)
	}
	return " (set from the environment: " + strings.Join(vars, ", ") + ")" + flanneldNote(fs, names...)
}

// env is the environment variable that mirrors a flag: --dial-timeout is
// OVERLAY_DIAL_TIMEOUT.
func env(flag string) string {
	return "OVERLAY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// otherVariables are OVERLAY_* names overlay uses that are not flags: the
// keys of subnet.env (systemd units often load it) and test knobs.
var otherVariables = []string{
	"OVERLAY_NETWORK", "OVERLAY_SUBNET", "OVERLAY_MTU", "OVERLAY_IPMASQ", "OVERLAY_IPV6_NETWORK", "OVERLAY_IPV6_SUBNET",
	"OVERLAY_TEST_TIMEOUT_SCALE", "OVERLAY_LAB_KEEP", "OVERLAY_FAULT_SEED",
}

// applyEnv sets every flag of cmd that reads the environment and was not
// given on the command line from its variable, and warns once about each
// OVERLAY_* variable that no flag reads.
func applyEnv(cmd *cobra.Command, environ []string, warn io.Writer) error {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	err := applyFlanneld(cmd.Flags(), vars, warn)
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || !readsEnv(f) {
			return
		}
		if v, ok := vars[env(f.Name)]; ok {
			err = setFlagFromEnv(f, env(f.Name), v)
		}
	})
	if err == nil {
		err = applyNodeName(cmd.Flags(), vars) // kube mode's NODE_NAME
	}
	if err != nil {
		return err
	}
	warnUnknownEnv(cmd.Root(), environ, warn)
	return nil
}

// setFlagFromEnv sets f from the environment variable name.
func setFlagFromEnv(f *pflag.Flag, name, v string) error {
	if err := f.Value.Set(v); err != nil {
		return usagef("environment %s=%s (for --%s): %v", name, shown(f.Name, v), f.Name, err)
	}
	f.Changed = true
	if f.Annotations == nil {
		f.Annotations = map[string][]string{}
	}
	f.Annotations[setFromEnv] = []string{name}
	return nil
}

func warnUnknownEnv(root *cobra.Command, environ []string, w io.Writer) {
	known := map[string]bool{}
	cliOnly := map[string]string{}
	for _, n := range otherVariables {
		known[n] = true
	}
	walk(root, func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if readsEnv(f) {
					known[env(f.Name)] = true
				} else if !isFlanneldOnly(f) { // flanneld's names read FLANNELD_* only
					cliOnly[env(f.Name)] = f.Name
				}
			})
		}
	})
	var names []string
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "OVERLAY_") && !known[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if flag, ok := cliOnly[name]; ok {
			fmt.Fprintf(w, "warning: ignoring %s: --%s is taken only from the command line\n", name, flag)
			continue
		}
		fmt.Fprintf(w, "warning: ignoring unknown environment variable %s (overlayd reads OVERLAY_<FLAG> only for the global flags and run's flags)\n", name)
	}
}

func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
}

// usesEtcd marks commands that connect to etcd: their etcd settings are
// checked as a whole (certificate with key, user with password, TLS files)
// before they run.
const usesEtcdAnnotation = "overlay-etcd"

func usesEtcd(c *cobra.Command) *cobra.Command {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[usesEtcdAnnotation] = "yes"
	return c
}

// validateEtcdFlags checks the etcd settings together, without connecting.
func (g *GlobalFlags) validateEtcdFlags(fs *pflag.FlagSet) error {
	if err := g.clientConfig().Validate(); err != nil {
		return usageError{fmt.Errorf("%w%s", err, envNote(fs, "endpoints", "cacert", "cert", "key", "user", "password"))}
	}
	return nil
}

// interfaceWith returns the interface that holds ip, or "": in this
// process's namespace, where run serves --health-addr.
func interfaceWith(ip netip.Addr) (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list this host's interfaces: %w", err)
	}
	for _, ifc := range ifaces {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip.AsSlice()) {
				return ifc.Name, nil
			}
		}
	}
	return "", nil
}

// checkHealthAddr checks that run can listen on --health-addr's host: an
// address of this host, a loopback or the unspecified address.
func checkHealthAddr(fs *pflag.FlagSet, addr string) error {
	host, _, _ := net.SplitHostPort(addr) // checked when set
	ip, err := netip.ParseAddr(host)
	if addr == "" || err != nil || ip.IsLoopback() || ip.IsUnspecified() {
		return nil // disabled, "", or localhost
	}
	ifc, err := interfaceWith(ip)
	if err != nil {
		return err
	}
	if ifc == "" {
		return usagef("--health-addr %q: %s is not an address of this host: use %s or one of this host's addresses%s", addr, ip, daemon.DefaultHealthAddr, envNote(fs, "health-addr"))
	}
	return nil
}
