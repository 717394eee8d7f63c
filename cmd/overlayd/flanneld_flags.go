package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flanneld's command line carries over to `overlayd run`, so a host moves
// from flanneld with its unit file and environment file as they are:
// every flag of flanneld v0.28 (its main.go) is either overlayd's flag of
// the same name, an alias of overlayd's flag under another name, or
// rejected with a line saying why and what to use instead — never
// silently ignored. Each also reads flanneld's variable, FLANNELD_<FLAG>
// (flannel's flagutil.SetFlagsFromEnv: upper case, '-' as '_', an empty
// value sets nothing), with overlayd's precedence: the command line, then
// OVERLAY_<FLAG>, then FLANNELD_<FLAG>.

// flanneldFlag is one flag of flanneld, and what overlayd run makes of it.
type flanneldFlag struct {
	name string
	// sets is the overlayd flag it sets under another name, with check
	// saying what it accepts ("" with no why: overlayd's flag of the same
	// name and meaning).
	sets  string
	check func(string) error
	// why overlayd has no equivalent, and what to use instead; noop is a
	// value that asks for what overlayd does anyway: accepted.
	why, noop string
	boolean   bool // flanneld's flag may be given without a value
}

var flanneldFlags = []flanneldFlag{
	{name: "iface"}, {name: "iface-regex"}, {name: "iface-can-reach"},
	{name: "public-ip"}, {name: "public-ipv6"}, {name: "subnet-file"}, {name: "ip-masq"},

	{name: "etcd-endpoints", sets: "endpoints", check: etcdEndpoints},
	{name: "etcd-prefix", sets: "prefix", check: keyPrefix},
	{name: "etcd-cafile", sets: "cacert", check: anyValue},
	{name: "etcd-certfile", sets: "cert", check: anyValue},
	{name: "etcd-keyfile", sets: "key", check: anyValue},
	{name: "etcd-username", sets: "user", check: etcdUsername},
	{name: "etcd-password", sets: "password", check: anyValue},
	{name: "healthz-ip", sets: "health-addr", check: healthzIP},
	{name: "healthz-port", sets: "health-addr", check: intIn(0, 65535)},

	// Kube mode (kube_flags.go): overlayd's flags of the same name.
	{name: "kube-subnet-mgr"}, {name: "kube-api-url"}, {name: "kubeconfig-file"},
	{name: "kube-annotation-prefix"}, {name: "set-node-network-unavailable"}, {name: "net-config-path"},
	{name: "subnet-lease-renew-margin", why: "overlayd keeps its lease alive continuously (etcd KeepAlive), so there is no renewal margin; --lease-ttl sets the lease's TTL"},
	{name: "iptables-resync", why: "overlayd masquerades with an nftables table of its own, which it re-checks every 30s; --ip-masq turns it on or off"},
	{name: "iptables-forward-rules", boolean: true, noop: "false", why: "overlayd adds no forward rules (an accept of its own cannot undo another chain's drop): accept the cluster network in the host firewall's forward chain, which overlayd warns about at start if it drops by policy; --iptables-forward-rules=false is accepted"},
	{name: "version", boolean: true, why: "use `overlayd version`"},
	{name: "v", why: logFlags},
	{name: "vmodule", why: logFlags},
	{name: "log_backtrace_at", why: logFlags},
}

const (
	logFlags = "overlayd logs with log/slog: use --log-level (debug, info, warn, error) and --log-format"
)

// Annotations of run's flags.
const (
	flanneldVarAnnotation  = "overlay-flanneld-var"  // the FLANNELD_* variable the flag reads
	flanneldOnlyAnnotation = "overlay-flanneld-only" // an alias or a rejected flag: flanneld's name
	setByFlanneld          = "overlay-set-by-flanneld"
)

// flanneldVar is flanneld's variable for flag: --etcd-endpoints is
// FLANNELD_ETCD_ENDPOINTS.
func flanneldVar(flag string) string {
	return "FLANNELD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// registerFlanneldFlags gives run flanneld's flags, hidden from its help
// (which shows overlayd's names), and a FLANNELD_* variable to each.
func registerFlanneldFlags(c *cobra.Command) {
	fs := c.Flags()
	for _, ff := range flanneldFlags {
		if ff.sets != "" || ff.why != "" {
			ff.register(fs)
		}
		annotate(fs, ff.name, flanneldVarAnnotation, flanneldVar(ff.name))
	}
	c.Long += "\n\nflanneld's flags and FLANNELD_* variables are accepted too, under flanneld's\n" +
		"names (--etcd-endpoints, --healthz-port, ...), or refused with the reason when\n" +
		"overlayd has no equivalent: see Documentation/configuration.md."
}

func (ff flanneldFlag) register(fs *pflag.FlagSet) {
	check := ff.check
	if ff.why != "" {
		check = ff.refuse
	}
	usage := "flanneld's --" + ff.name + ": use --" + ff.sets
	if ff.why != "" {
		usage = "flanneld's --" + ff.name + ": refused, " + ff.why
	}
	shorthand := ""
	if ff.name == "v" {
		shorthand = "v" // klog's -v=2, as flanneld takes it
	}
	fs.StringP(ff.name, shorthand, "", usage)
	checkFlag(fs, ff.name, check)
	f := fs.Lookup(ff.name)
	if ff.boolean {
		f.NoOptDefVal = "true"
	}
	f.Hidden = true
	annotate(fs, ff.name, flanneldOnlyAnnotation, ff.name)
}

// refuse is the check of a flag overlayd has no equivalent for.
func (ff flanneldFlag) refuse(s string) error {
	if b, err := strconv.ParseBool(s); err == nil && ff.noop != "" && strconv.FormatBool(b) == ff.noop {
		return nil
	}
	return errors.New("flanneld's --" + ff.name + " has no equivalent in overlayd: " + ff.why)
}

func annotate(fs *pflag.FlagSet, name, key, value string) {
	if err := fs.SetAnnotation(name, key, []string{value}); err != nil {
		panic(err) // a flag name typo: caught by every test
	}
}

func isFlanneldOnly(f *pflag.Flag) bool { return f.Annotations[flanneldOnlyAnnotation] != nil }

// applyFlanneld runs before the OVERLAY_* variables are read (applyEnv):
// flanneld's own flags take their FLANNELD_* variables, an alias sets
// overlayd's flag, and overlayd's flags take their FLANNELD_* variables
// where neither the command line nor an OVERLAY_* variable sets them.
func applyFlanneld(fs *pflag.FlagSet, vars map[string]string, warn io.Writer) error {
	known := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if v := f.Annotations[flanneldVarAnnotation]; v != nil {
			known[v[0]] = true
		}
	})
	if len(known) == 0 {
		return nil // not run
	}
	if err := flanneldVars(fs, vars, warn, true); err != nil {
		return err
	}
	for _, target := range aliasTargets() {
		if err := applyAlias(fs, target, vars, warn); err != nil {
			return err
		}
	}
	if err := flanneldVars(fs, vars, warn, false); err != nil {
		return err
	}
	warnUnknownFlanneldVars(known, vars, warn)
	return nil
}

// flanneldVars sets flanneld's own flags (own) or overlayd's flags (!own)
// from their FLANNELD_* variables. overlayd's give way to the command line
// and, with a warning, to their OVERLAY_* variable.
func flanneldVars(fs *pflag.FlagSet, vars map[string]string, warn io.Writer, own bool) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		name := f.Annotations[flanneldVarAnnotation]
		if err != nil || name == nil || vars[name[0]] == "" || f.Changed || isFlanneldOnly(f) != own {
			return
		}
		if !own && overlayVarWins(f, name[0], vars, warn) {
			return
		}
		err = setFlagFromEnv(f, name[0], vars[name[0]])
	})
	return err
}

// overlayVarWins warns when flag's OVERLAY_* variable is set as well as
// flanneld's variable flanneldName: overlayd's own wins.
func overlayVarWins(flag *pflag.Flag, flanneldName string, vars map[string]string, warn io.Writer) bool {
	if _, set := vars[env(flag.Name)]; !set || !readsEnv(flag) {
		return false
	}
	fmt.Fprintf(warn, "warning: ignoring %s: %s is set too, and wins\n", flanneldName, env(flag.Name))
	return true
}

// aliasTargets are the overlayd flags flanneld's flags set under other
// names, in the table's order.
func aliasTargets() []string {
	var out []string
	for _, ff := range flanneldFlags {
		if ff.sets != "" && !slices.Contains(out, ff.sets) {
			out = append(out, ff.sets)
		}
	}
	return out
}

// applyAlias sets overlayd's flag target from flanneld's flags for it, if
// any is set. Given on the command line with target too, they conflict;
// from FLANNELD_* variables, they give way to target's command line and
// OVERLAY_* variable.
func applyAlias(fs *pflag.FlagSet, target string, vars map[string]string, warn io.Writer) error {
	t := fs.Lookup(target)
	var given, fromVars []string
	for _, ff := range flanneldFlags {
		f := fs.Lookup(ff.name)
		if ff.sets != target || !f.Changed {
			continue
		}
		if v := f.Annotations[setFromEnv]; v != nil {
			fromVars = append(fromVars, v[0])
		} else {
			given = append(given, "--"+ff.name)
		}
	}
	switch {
	case len(given) > 0 && t.Changed:
		return usagef("%s is flanneld's name for --%s: give one of them", strings.Join(given, " and "), target)
	case len(given) == 0 && len(fromVars) == 0:
		return nil
	case len(given) == 0 && (t.Changed || overlayVarWins(t, strings.Join(fromVars, ", "), vars, warn)):
		return nil // the command line wins silently, as over OVERLAY_* variables
	}
	value := aliasValue(fs, target, warn)
	if err := t.Value.Set(value); err != nil {
		return usagef("--%s %s (from %s): %v", target, shown(target, value), strings.Join(append(given, fromVars...), ", "), err)
	}
	t.Changed = true
	if len(given) > 0 {
		annotate(fs, target, setByFlanneld, strings.Join(given, ", "))
	} else {
		annotate(fs, target, setFromEnv, strings.Join(fromVars, ", "))
	}
	return nil
}

// aliasValue is target's value from flanneld's flags for it.
func aliasValue(fs *pflag.FlagSet, target string, warn io.Writer) string {
	if target == "health-addr" {
		return healthzAddr(fs, warn)
	}
	for _, ff := range flanneldFlags {
		if ff.sets == target {
			return fs.Lookup(ff.name).Value.String()
		}
	}
	panic("no flanneld flag sets --" + target)
}

// healthzAddr is --health-addr from flanneld's --healthz-ip (default
// 0.0.0.0) and --healthz-port (default 0: no health server), as flanneld
// reads them once either is given.
func healthzAddr(fs *pflag.FlagSet, warn io.Writer) string {
	ip := "0.0.0.0"
	if f := fs.Lookup("healthz-ip"); f.Changed {
		ip = f.Value.String()
	}
	port := 0
	if f := fs.Lookup("healthz-port"); f.Changed {
		port, _ = strconv.Atoi(f.Value.String()) // checked when set
	}
	if port == 0 {
		fmt.Fprintln(warn, "warning: no health server: flanneld's --healthz-port is 0 (its default) or unset, so /healthz, /readyz, /metrics and /status are not served; set --healthz-port or --health-addr")
		return ""
	}
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

func warnUnknownFlanneldVars(known map[string]bool, vars map[string]string, warn io.Writer) {
	var names []string
	for name := range vars {
		if strings.HasPrefix(name, "FLANNELD_") && !known[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(warn, "warning: ignoring %s: flanneld v0.28 has no such flag, nor has overlayd\n", name)
	}
}

// flanneldNote names the flanneld flags that set any of the flags names,
// for an error about those flags: the user gave flanneld's names.
func flanneldNote(fs *pflag.FlagSet, names ...string) string {
	by := annotations(fs, setByFlanneld, names)
	if len(by) == 0 {
		return ""
	}
	return " (set by " + strings.Join(by, ", ") + ")"
}

// flanneldArgs lets flanneld's single-dash flags through: Go's flag
// package, which flanneld parses its command line with, reads
// -etcd-endpoints=URL as --etcd-endpoints=URL, where pflag would read
// shorthand flags -e -t -c ...
func flanneldArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(name) > 1 && isFlanneldFlag(name) {
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}

func isFlanneldFlag(name string) bool {
	return slices.ContainsFunc(flanneldFlags, func(ff flanneldFlag) bool { return ff.name == name })
}

// The checks of flanneld's names.

func etcdEndpoints(s string) error { return (&endpointsValue{eps: new([]string)}).Set(s) }

func anyValue(string) error { return nil } // checked with the other etcd settings

// etcdUsername is a user name alone: overlayd's --user would read a ':'
// in it as the start of a password.
func etcdUsername(s string) error {
	if strings.Contains(s, ":") {
		return errors.New("want a user name without ':' (put the password in --etcd-password)")
	}
	return nil
}

func healthzIP(s string) error {
	if ip, err := netip.ParseAddr(s); (err != nil || ip.Zone() != "") && s != "localhost" {
		return errors.New("want an IP address such as 0.0.0.0 or 127.0.0.1")
	}
	return nil
}
