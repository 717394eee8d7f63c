package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks a mistake in how the command was called (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// streams are the command's standard streams, injected so tests can run
// commands in-process.
type streams struct {
	in       io.Reader
	out, err io.Writer
}

// daemonRunner runs the daemon until ctx ends: daemon.Run, or in tests a
// function that records the Config run's flags built.
type daemonRunner func(ctx context.Context, cfg daemon.Config) error

// program is everything a command line runs with besides its arguments,
// injected: the streams, the environment and the daemon runner.
type program struct {
	streams
	environ   []string
	runDaemon daemonRunner
	// kube is the Kubernetes client (overlayd-kube), nil without one
	// (overlayd), which hands a command in kube mode over with handOver.
	kube     kubeClient
	handOver handOver
}

// GlobalFlags are the etcdctl-style flags every command shares.
type GlobalFlags struct {
	Endpoints   []string
	Prefix      string
	CACert      string
	Cert        string
	Key         string
	User        string
	Password    string
	DialTimeout time.Duration
	WriteOut    string

	// out is -w's format, parsed once before any command runs.
	out printer.Format

	// flags are the running command's flags, to say which of the etcd
	// settings came from the environment or flanneld's names.
	flags *pflag.FlagSet
}

// execute runs the CLI and returns the process exit code.
func execute(args []string, in io.Reader, out, errOut io.Writer) int {
	return executeEnv(args, os.Environ(), in, out, errOut)
}

// executeEnv is execute with the environment given.
func executeEnv(args, environ []string, in io.Reader, out, errOut io.Writer) int {
	if err := checkHandOver(environ); err != nil {
		fmt.Fprintln(errOut, "Error:", err)
		return exitError
	}
	return executeProgram(args, program{streams: streams{in: in, out: out, err: errOut}, environ: environ, runDaemon: runTuned,
		kube: linkedKube, handOver: handOverToKube})
}

// executeProgram runs the command line args with p and returns the exit
// code.
func executeProgram(args []string, p program) int {
	environ, errOut := p.environ, p.err
	root := newRootCommand(p)
	args = flanneldArgs(args)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	code := exitError
	if note := sourceNote(cmd, err); note != "" {
		err = fmt.Errorf("%w%s", err, note)
	}
	var ue usageError
	if errors.As(err, &ue) {
		code = exitUsage
	}
	writeExitError(errOut, cmd, args, environ, err, code, commandPath(root, args))
	return code
}

// sourceNote names the variables (OVERLAY_*, FLANNELD_*) or flanneld's
// flag names that set the flags err names as --flag, when err does not
// say so already: the user set no flag of that name, and must be told what
// to change. Errors of the daemon and of etcd's client name the flag only.
func sourceNote(cmd *cobra.Command, err error) string {
	msg := err.Error()
	if cmd == nil || strings.Contains(msg, "(set from the environment: ") || strings.Contains(msg, "(set by ") {
		return ""
	}
	var named []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if namesFlag(msg, f.Name) {
			named = append(named, f.Name)
		}
	})
	return envNote(cmd.Flags(), named...)
}

// namesFlag says whether msg names --flag (not a longer flag it begins).
func namesFlag(msg, flag string) bool {
	for rest := msg; ; {
		_, after, ok := strings.Cut(rest, "--"+flag)
		if !ok {
			return false
		}
		if after == "" || !(after[0] == '-' || after[0] >= 'a' && after[0] <= 'z') {
			return true
		}
		rest = after
	}
}

func commandPath(root *cobra.Command, args []string) string {
	if c, _, err := root.Find(args); err == nil {
		return c.CommandPath()
	}
	return root.Name()
}

func newRootCommand(p program) *cobra.Command {
	s, environ := p.streams, p.environ
	g := &GlobalFlags{}
	root := &cobra.Command{
		Use:   "overlayd",
		Short: "VXLAN overlay network daemon and cluster management CLI",
		Long: `overlayd runs on every host of a container cluster (overlayd run): it leases a
subnet of the cluster network from etcd, programs a VXLAN device with a route,
neighbour and FDB entry for every other host, and writes subnet.env for the
overlay-cni plugin. The other commands manage leases and config like etcdctl.

The global flags and the flags of 'overlayd run' can also be set through the
environment: --endpoints is OVERLAY_ENDPOINTS, --node-name is
OVERLAY_NODE_NAME, and so on (teardown, status and doctor read the same
variables for the flags they share with run). Other flags, such as --force and --dry-run,
are taken only from the command line.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			g.flags = cmd.Flags()
			var warnings strings.Builder
			err := applyEnv(cmd, environ, &warnings)
			if err == nil && kubeMode(cmd) && p.kube == nil && p.handOver != nil {
				// Before anything is written: overlayd-kube says it all.
				return p.handOver(environ)
			}
			writeWarnings(cmd.ErrOrStderr(), cmd, environ, warnings.String())
			if err != nil {
				return err
			}
			if g.out, err = g.format(); err != nil {
				return err
			}
			if cmd.Annotations[usesEtcdAnnotation] != "" {
				return g.validateEtcdFlags(cmd.Flags())
			}
			return nil
		},
	}
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	root.SetFlagErrorFunc(flagError)

	pf := root.PersistentFlags()
	g.Endpoints = []string{"http://127.0.0.1:2379"}
	pf.Var(&endpointsValue{eps: &g.Endpoints}, "endpoints", "etcd endpoints, comma-separated (http://, https://, unix:// or unixs://)")
	pf.StringVar(&g.Prefix, "prefix", etcdv3.DefaultPrefix, "etcd key prefix of the network (flannel's default)")
	pf.StringVar(&g.CACert, "cacert", "", "verify etcd's server certificate with this CA bundle (PEM)")
	pf.StringVar(&g.Cert, "cert", "", "client certificate for etcd mutual TLS (PEM)")
	pf.StringVar(&g.Key, "key", "", "client key for etcd mutual TLS (PEM)")
	pf.StringVar(&g.User, "user", "", "etcd user name[:password]")
	pf.StringVar(&g.Password, "password", "", "etcd password (instead of name:password in --user; prefer OVERLAY_PASSWORD)")
	pf.DurationVar(&g.DialTimeout, "dial-timeout", 5*time.Second, "how long to wait for etcd on each request")
	pf.StringVarP(&g.WriteOut, "write-out", "w", "table", "output format: table, json or simple")
	checkFlag(pf, "prefix", keyPrefix)
	checkFlag(pf, "user", userName)
	checkFlag(pf, "dial-timeout", durationAtLeast(time.Millisecond))
	checkFlag(pf, "write-out", oneOf("table", "json", "simple"))
	pf.VisitAll(func(f *pflag.Flag) { fromEnv(pf, f.Name) })

	root.AddCommand(
		newRunCommand(g, p.runDaemon, p.kube),
		newTeardownCommand(g),
		newStatusCommand(g),
		newDoctorCommand(g, p.kube),
		newLeaseCommand(g),
		newConfigCommand(g),
		newInstallCNICommand(g),
		newMasqueradeCommand(g),
		newVersionCommand(g),
	)
	// cobra's own commands now, so they get the same treatment.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	setUsageArgs(root)
	checkBoolFlags(root)
	return root
}

// checkBoolFlags gives cobra's own boolean flags (--help, completion's
// --no-descriptions) the check ours have, so a bad value says "want true
// or false" rather than strconv's words.
func checkBoolFlags(root *cobra.Command) {
	walk(root, func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if _, checked := f.Value.(checkedValue); !checked && f.Value.Type() == "bool" {
				f.Value = checkedValue{f.Value, boolean}
			}
		})
	})
}

// setUsageArgs makes argument-count errors usage errors, and makes command
// groups (lease, config) reject unknown subcommands with a usage error.
func setUsageArgs(c *cobra.Command) {
	if c.Args != nil {
		c.Args = usageArgs(c.Args)
	}
	if c.HasSubCommands() && c.RunE == nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, _ []string) error {
			return usagef("%s needs a subcommand: %s", cmd.CommandPath(), subcommandNames(cmd))
		}
	}
	for _, sub := range c.Commands() {
		setUsageArgs(sub)
	}
}

func subcommandNames(c *cobra.Command) string {
	var names []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return strings.Join(names, ", ")
}

func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			if cmd.HasSubCommands() {
				return usageError{err}
			}
			return argsError(cmd, args)
		}
		return nil
	}
}

// argsError says what is wrong with the arguments of a command that takes
// no subcommands: a stray argument is named as such (cobra calls it an
// "unknown command"), a missing one by its name in the command's usage.
func argsError(cmd *cobra.Command, args []string) error {
	want := positionals(cmd.Use)
	switch {
	case len(args) > len(want) && len(want) == 0:
		return usagef("unexpected argument %q: %s takes no arguments (flags start with --)", args[0], cmd.CommandPath())
	case len(args) > len(want):
		return usagef("unexpected argument %q: %s takes one argument, %s", args[len(want)], cmd.CommandPath(), strings.Join(want, " "))
	}
	return usagef("missing %s: usage: %s %s", strings.Join(want[len(args):], " "), cmd.CommandPath(), strings.Join(want, " "))
}

// positionals are the argument names in a command's usage line ("get
// SUBNET" has SUBNET), up to its first flag or optional part.
func positionals(use string) []string {
	var names []string
	for _, w := range strings.Fields(use)[1:] {
		if strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[") {
			break
		}
		names = append(names, w)
	}
	return names
}

// format is -w's value in any case, as its flag check (oneOf) and every
// other choice flag take it.
func (g *GlobalFlags) format() (printer.Format, error) {
	f, err := printer.ParseFormat(strings.ToLower(g.WriteOut))
	if err != nil {
		return "", usageError{err}
	}
	return f, nil
}

func (g *GlobalFlags) clientConfig() etcdclient.Config {
	user, password := etcdclient.ParseUser(g.User)
	if g.Password != "" {
		password = g.Password
	}
	return etcdclient.Config{
		Endpoints: g.Endpoints, CACert: g.CACert, Cert: g.Cert, Key: g.Key,
		Username: user, Password: password, DialTimeout: g.DialTimeout,
	}
}

// session is what every command that uses etcd starts with: the output
// format (-w), the command's context, and a registry on a checked etcd
// connection — so a wrong CA, a missing client certificate or a bad
// password is reported precisely up front. Each request waits at most
// --dial-timeout (boundRequests); the command as a whole is not bounded,
// as it makes as many requests as its work needs. close closes the
// connection.
type session struct {
	ctx    context.Context
	format printer.Format
	reg    *etcdv3.Registry
	close  func()
}

// open starts a command's session. With forLeases the registry looks
// where the stored network keeps its leases (an IPv6-only network's are
// under subnets6/), or where flannel's are if no config can be read.
func (g *GlobalFlags) open(cmd *cobra.Command, forLeases bool) (*session, error) {
	ctx := cmd.Context()
	cli, err := etcdclient.Connect(ctx, g.clientConfig())
	if err != nil {
		return nil, g.settingsNote(err)
	}
	boundRequests(cli, g.DialTimeout)
	s := &session{ctx: ctx, format: g.out, reg: etcdv3.NewRegistry(cli, g.Prefix), close: func() { _ = cli.Close() }}
	if forLeases {
		if cfg, _, err := s.reg.GetConfig(ctx); err == nil {
			s.reg = s.reg.For(cfg)
		}
	}
	return s, nil
}

// etcdHint explains a failed etcd request: which endpoint, TLS or
// credential problem caused it, or what to check.
func (g *GlobalFlags) etcdHint(err error) error {
	if err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.DialTimeout)
	defer cancel()
	return g.settingsNote(etcdclient.Explain(ctx, g.clientConfig(), err))
}

// settingsNote adds to an error about the etcd settings — one that tells
// to check --endpoints, --cacert, --user ... — which of them were set from
// the environment (OVERLAY_*, FLANNELD_*) or by flanneld's flag names, as
// the user set no flag of the name the error gives.
func (g *GlobalFlags) settingsNote(err error) error {
	if g.flags == nil || !errors.Is(err, etcdclient.ErrConfig) && !errors.Is(err, etcdclient.ErrUnreachable) {
		return err
	}
	if note := envNote(g.flags, "endpoints", "cacert", "cert", "key", "user", "password", "dial-timeout"); note != "" {
		return fmt.Errorf("%w%s", err, note)
	}
	return err
}
