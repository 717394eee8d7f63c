package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// hostFlags identify this host; run and teardown share them.
type hostFlags struct {
	publicIP, publicIPv6 netip.Addr
	nodeName, subnetFile string
	logFormat, logLevel  string
	underlay             underlayFlags // with the public addresses: daemon.Config.ChooseUnderlay
}

func (h *hostFlags) register(c *cobra.Command) {
	f := c.Flags()
	h.underlay.register(f)
	f.Var(addrValue{&h.publicIP}, "public-ip", "this host's address on the underlay, published to peers (default: the first IPv4 address of --iface); an IPv6 address is taken as --public-ipv6")
	f.Var(addrValue{&h.publicIPv6}, "public-ipv6", "this host's IPv6 address on the underlay, used if the network carries IPv6 (default: the first global IPv6 address of --iface)")
	f.StringVar(&h.nodeName, "node-name", "", "node ID (default: /etc/machine-id, else the hostname)")
	f.StringVar(&h.subnetFile, "subnet-file", subnet.DefaultEnvFile, "where to write subnet.env for overlay-cni")
	f.StringVar(&h.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&h.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	checkFlag(f, "public-ip", hostIP)
	checkFlag(f, "public-ipv6", hostIPv6)
	checkFlag(f, "node-name", nodeName)
	checkFlag(f, "subnet-file", absFile)
	checkFlag(f, "log-format", oneOf("text", "json"))
	checkFlag(f, "log-level", oneOf("debug", "info", "warn", "error"))
	// The same host as run's: the same environment (see fromEnv).
	fromEnv(f, "iface", "public-ip", "public-ipv6", "node-name", "subnet-file", "log-format", "log-level")
}

// config is the daemon.Config the host flags and g describe, with the
// underlay chosen (daemon.Config.ChooseUnderlay) before run or teardown
// touches anything: a flag naming an interface or address this host does
// not have is a usage error.
func (h *hostFlags) config(g *GlobalFlags, fs *pflag.FlagSet, errOut io.Writer) (daemon.Config, error) {
	log, err := newLogger(errOut, h.logFormat, h.logLevel)
	if err != nil {
		return daemon.Config{}, err
	}
	cfg := daemon.Config{Etcd: g.clientConfig(), Prefix: g.Prefix, NodeName: h.nodeName, SubnetFile: h.subnetFile, Logger: log}
	publicIP, publicIPv6, err := h.publicAddrs(fs)
	if err != nil {
		return cfg, err
	}
	if err := cfg.ChooseUnderlay(daemon.UnderlayFlags{Selection: h.underlay.selection(), PublicIP: publicIP, PublicIPv6: publicIPv6}); err != nil {
		return cfg, usageError{fmt.Errorf("%w%s", err, envNote(fs, "iface", "iface-regex", "iface-can-reach", "public-ip", "public-ipv6"))}
	}
	return cfg, nil
}

// publicAddrs are the host's public IPv4 and IPv6 addresses from
// --public-ip and --public-ipv6: an IPv6 --public-ip is the IPv6 one (a
// DaemonSet passes the node's address without knowing its family), unless
// --public-ipv6 names another.
func (h *hostFlags) publicAddrs(fs *pflag.FlagSet) (v4, v6 netip.Addr, err error) {
	if !h.publicIP.Is6() {
		return h.publicIP, h.publicIPv6, nil
	}
	if h.publicIPv6.IsValid() && h.publicIPv6 != h.publicIP {
		return v4, v6, usagef("--public-ip %s is an IPv6 address, taken as --public-ipv6, but --public-ipv6 is %s: give one IPv6 address%s",
			h.publicIP, h.publicIPv6, envNote(fs, "public-ip", "public-ipv6"))
	}
	return netip.Addr{}, h.publicIP, nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: use text or json", format)
}

func newRunCommand(g *GlobalFlags, runDaemon daemonRunner, kc kubeClient) *cobra.Command {
	var (
		h                         hostFlags
		k                         kubeFlags
		cfg                       daemon.Config // built by PreRunE
		leaseTTL                  time.Duration
		kernelResync, leaseResync time.Duration
		ipMasq, adoptFlannel      bool
		flannelSubnetFile         string
		vxlanGuard                bool
		healthAddr                string
		peerProbe                 bool
		peerProbeSweep            time.Duration
		peerProbeRate             int
	)
	c := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: lease a subnet, program the VXLAN data path, write subnet.env",
		Long: `Run the overlay daemon on this host until SIGTERM or SIGINT (SIGHUP is
logged and ignored).

It leases a subnet from etcd (adopting this host's existing lease or
reservation) — or, with --kube-subnet-mgr, takes its Node's podCIDR from the
Kubernetes API as flanneld does —, creates the VXLAN device overlay.<VNI>, keeps a neighbour, FDB
entry and route for every other host's lease, and writes subnet.env for
overlay-cni. On SIGTERM it exits leaving the data path in place, so a restart
drops no packets; 'overlayd teardown' removes it.`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) (err error) {
			if cfg, err = h.config(g, cmd.Flags(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			if err := k.source(cmd.Flags(), &cfg, kc); err != nil {
				return err
			}
			return checkHealthAddr(cmd.Flags(), healthAddr)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.LeaseTTL, cfg.KernelResync, cfg.LeaseResync = leaseTTL, kernelResync, leaseResync
			cfg.IPMasq, cfg.HealthAddr, cfg.AdoptFlannel = ipMasq, healthAddr, adoptFlannel
			cfg.FlannelSubnetFile = flannelSubnetFile
			cfg.NoPeerProbe = !peerProbe
			cfg.PeerProbe = peerhealth.Settings{Sweep: peerProbeSweep, Rate: float64(peerProbeRate)}
			cfg.VXLANGuard = vxlanGuard
			cfg.SubnetFileFormat = subnet.EnvFormat(strings.ToLower(cmd.Flags().Lookup("subnet-file-format").Value.String()))
			tuneGC()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			defer ignoreHangup(ctx, cfg.Logger)()
			if err := runDaemon(ctx, cfg); err != nil {
				return err
			}
			return nil
		},
	}
	h.register(c)
	c.Flags().DurationVar(&leaseTTL, "lease-ttl", etcdv3.DefaultLeaseTTL, "TTL of this host's lease in etcd; kept alive while overlayd runs")
	c.Flags().DurationVar(&kernelResync, "kernel-resync", 30*time.Second, "how often to re-read the kernel and repair drift")
	c.Flags().DurationVar(&leaseResync, "lease-resync", etcdv3.DefaultResyncInterval, "how often to re-list all leases from etcd in case a watch stalled")
	c.Flags().BoolVar(&ipMasq, "ip-masq", true, "masquerade pod traffic leaving the cluster network (nftables table \"overlay\"); pod-to-pod traffic is never NATed")
	c.Flags().BoolVar(&vxlanGuard, "vxlan-guard", true, "accept UDP to the VXLAN port only from the public addresses of hosts holding a valid lease; drop and count the rest (nftables table \"overlay-guard\")")
	c.Flags().StringVar(&healthAddr, "health-addr", daemon.DefaultHealthAddr, "serve /healthz, /readyz, /metrics and /status here (\"\" disables)")
	c.Flags().BoolVar(&adoptFlannel, "adopt-flannel", false, "take over what flanneld left on this host in place: its devices flannel.<VNI>/flannel-v6.<VNI> with their MACs, their routes, its masquerade chain (see Documentation/migrating-from-flannel.md)")
	checkFlag(c.Flags(), "adopt-flannel", boolean)
	c.Flags().StringVar(&flannelSubnetFile, "flannel-subnet-file", daemon.FlannelSubnetFile, "with --adopt-flannel: the subnet.env flanneld wrote (its --subnet-file); the subnet it names must be this host's lease (kube mode: its Node's podCIDR), or overlayd refuses to take over")
	checkFlag(c.Flags(), "flannel-subnet-file", absFile)
	c.Flags().BoolVar(&peerProbe, "peer-probe", true, "probe every peer through the overlay (ICMP echo to its VTEP address) and report its health in /status, `overlayd status --peers` and the metrics")
	c.Flags().DurationVar(&peerProbeSweep, "peer-probe-sweep", peerhealth.DefaultSweep, "probe each peer this often (longer when there are more peers than --peer-probe-rate allows in it)")
	c.Flags().IntVar(&peerProbeRate, "peer-probe-rate", peerhealth.DefaultRate, "send at most this many probes per second, whatever the number of peers")
	checkFlag(c.Flags(), "peer-probe", boolean)
	checkFlag(c.Flags(), "peer-probe-sweep", durationAtLeast(peerhealth.MinSweep))
	checkFlag(c.Flags(), "peer-probe-rate", intIn(1, peerhealth.MaxRate))
	fromEnv(c.Flags(), "peer-probe", "peer-probe-sweep", "peer-probe-rate")
	c.Flags().String("subnet-file-format", string(subnet.FormatOverlay), "format of --subnet-file: overlay (OVERLAY_* keys, for overlay-cni) or flannel (flanneld's FLANNEL_* keys, for tools written for flannel; overlay-cni reads both)")
	checkFlag(c.Flags(), "subnet-file-format", oneOf(string(subnet.FormatOverlay), string(subnet.FormatFlannel)))
	fromEnv(c.Flags(), "subnet-file-format")
	checkFlag(c.Flags(), "lease-ttl", durationAtLeast(10*time.Second))
	checkFlag(c.Flags(), "kernel-resync", durationAtLeast(time.Second))
	checkFlag(c.Flags(), "lease-resync", durationAtLeast(time.Second))
	checkFlag(c.Flags(), "ip-masq", boolean)
	checkFlag(c.Flags(), "vxlan-guard", boolean)
	checkFlag(c.Flags(), "health-addr", listenAddr(true))
	fromEnv(c.Flags(), "lease-ttl", "kernel-resync", "lease-resync", "ip-masq", "vxlan-guard", "health-addr", "adopt-flannel", "flannel-subnet-file")
	k.register(c, true)
	registerFlanneldFlags(c)
	return usesEtcd(c)
}

// HangupIgnored is what `overlayd run` logs, at info, when it receives
// SIGHUP. Without a handler SIGHUP ends a Go program at once (exit 129,
// nothing logged, the liveness key left to expire), which a closing
// terminal or a `kill -HUP` habit would do to the daemon. There is nothing
// to reload: the flags and the environment are read at start, the TLS
// files at each new connection to etcd, and the network config and the
// leases are watched already.
const HangupIgnored = "SIGHUP ignored: there is nothing to reload (flags and environment are read at start, TLS files at each new etcd connection); restart overlayd to apply a changed setting (a restart drops no packets)"

// ignoreHangup logs and otherwise ignores SIGHUP until ctx ends or the
// returned function is called.
func ignoreHangup(ctx context.Context, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-hup:
				log.Info(HangupIgnored)
			case <-ctx.Done():
				return
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-finished
	}
}

// gcPercent is the garbage collector's target heap growth for `overlayd run`
// (Go's default is 100) unless GOGC is set. The daemon's live heap is small
// and most of what it allocates is short-lived (a listing of every lease at
// start-up, a listing of the kernel at each resync), so collecting earlier
// keeps the peak resident size down for a little CPU at start-up;
// Documentation/benchmarks.md measures the trade.
const gcPercent = 50

// tuneGC is a process-wide setting, so it belongs to the program, not to
// the daemon library (tests and the benchmark run the library in-process).
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
}

// startProcs runs the cold start on one P (GOMAXPROCS=1) unless GOMAXPROCS
// is set, and returns what puts the runtime's default back (which follows
// the CPUs and the cgroup's quota): the daemon calls it once every data
// plane's first pass is over. A cold start is a chain of steps that wait on
// etcd and the kernel in turn; with a second P, the runtime spent CPU
// during those waits on idle-priority GC mark workers and threads spinning
// for work, a tenth of the daemon's CPU at 5,000 peers
// (Documentation/benchmarks.md, issue 33). After the start the default
// returns, so lease events are not queued behind a resync pass or the
// prober.
func startProcs() (restore func()) {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return nil
	}
	runtime.GOMAXPROCS(1)
	return sync.OnceFunc(runtime.SetDefaultGOMAXPROCS)
}

// runTuned is daemon.Run as the program runs it: with the start-up on one
// P (startProcs). A process-wide setting, so it is the program's, not the
// library's, and not made by tests that hand the command a runner of
// their own.
func runTuned(ctx context.Context, cfg daemon.Config) error {
	if restore := startProcs(); restore != nil {
		defer restore() // a start that ends before any pass
		cfg.AfterFirstPass = restore
	}
	return daemon.Run(ctx, cfg)
}

func newTeardownCommand(g *GlobalFlags) *cobra.Command {
	var (
		h     hostFlags
		cfg   daemon.Config // built by PreRunE
		vni   int
		force bool
	)
	c := &cobra.Command{
		Use:   "teardown",
		Short: "Remove this host's VXLAN device, routes, neighbours, FDB entries, lease and subnet.env",
		Long: `Remove everything overlayd set up on this host. Stop 'overlayd run' first:
teardown refuses while it runs (whatever its --subnet-file) unless --force.

The lease key is deleted (a reservation is kept: an operator made it) and its
etcd lease revoked. If etcd cannot be reached, the data path and subnet.env
are still removed (using --vni) and teardown exits 1: the lease stays until
its TTL runs out. Only what was found is reported as removed.`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg, err = h.config(g, cmd.Flags(), cmd.ErrOrStderr())
			return err
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			format := g.out
			res, err := daemon.Teardown(ctx, cfg, daemon.TeardownOptions{VNI: vni, Force: force})
			if format == printer.Table {
				printTeardown(cmd.OutOrStdout(), res)
			} else if res.Device != "" { // else it stopped before looking
				_ = printer.Write(cmd.OutOrStdout(), format, teardownOutput(res))
			}
			return err
		},
	}
	h.register(c)
	c.Flags().IntVar(&vni, "vni", 1, "VNI of the device to remove when etcd cannot be reached")
	checkFlag(c.Flags(), "vni", intIn(1, 1<<24-1))
	c.Flags().BoolVar(&force, "force", false, "tear down even while overlayd runs on this host (it rebuilds what it owns)")
	checkFlag(c.Flags(), "force", boolean)
	return usesEtcd(c)
}

// teardownReport is what `teardown -w json` prints: what was removed, and
// nothing that was not.
type teardownReport struct {
	Removed       []string `json:"removed"`                 // devices, the nftables table, subnet.env
	LeaseReleased string   `json:"leaseReleased,omitempty"` // the subnet whose lease was deleted
	LeaseKept     string   `json:"leaseKept,omitempty"`     // why none was
	LeftInPlace   []string `json:"leftInPlace"`             // what stayed, and why
}

// teardownOutput is res for -w json, and for -w simple as rows of a kind
// and a value: "removed overlay.1", "released 10.244.7.0/24", "kept WHY",
// "left WHY".
func teardownOutput(res daemon.TeardownResult) printer.Output {
	rep := teardownReport{Removed: []string{}, LeaseReleased: res.LeaseRemoved, LeaseKept: res.LeaseKept, LeftInPlace: []string{}}
	for _, dev := range res.Removed {
		rep.Removed = append(rep.Removed, dev.Name)
	}
	if res.MasqRemoved {
		rep.Removed = append(rep.Removed, "nftables table inet "+masq.TableName)
	}
	if res.GuardRemoved {
		rep.Removed = append(rep.Removed, "nftables table inet "+guard.TableName)
	}
	if res.SubnetFile != "" {
		rep.Removed = append(rep.Removed, res.SubnetFile)
	}
	rep.LeftInPlace = append(rep.LeftInPlace, res.Warnings...)
	var rows [][]string
	for _, r := range rep.Removed {
		rows = append(rows, []string{"removed", r})
	}
	for _, kv := range [][2]string{{"released", rep.LeaseReleased}, {"kept", rep.LeaseKept}} {
		if kv[1] != "" {
			rows = append(rows, kv[:])
		}
	}
	for _, w := range rep.LeftInPlace {
		rows = append(rows, []string{"left", w})
	}
	return printer.Output{Rows: rows, JSON: rep}
}

// printTeardown says what teardown removed, and nothing it did not.
func printTeardown(out io.Writer, res daemon.TeardownResult) {
	if res.Device == "" {
		return // it stopped before looking
	}
	var lines []string
	for _, dev := range res.Removed {
		lines = append(lines, "removed device "+dev.Name+" and its routes, neighbours and FDB entries")
	}
	if res.MasqRemoved {
		lines = append(lines, "removed nftables table inet "+masq.TableName)
	}
	if res.GuardRemoved {
		lines = append(lines, "removed nftables table inet "+guard.TableName+" (the VXLAN guard)")
	}
	if res.LeaseRemoved != "" {
		lines = append(lines, "released lease "+res.LeaseRemoved)
	}
	if res.SubnetFile != "" {
		lines = append(lines, "removed "+res.SubnetFile)
	}
	if len(lines) == 0 {
		lines = append(lines, "nothing to remove on this host: no device "+res.Device+", no nftables table, no subnet file")
	}
	if res.LeaseKept != "" {
		lines = append(lines, "lease kept: "+res.LeaseKept)
	}
	for _, w := range res.Warnings {
		lines = append(lines, "left in place: "+w)
	}
	fmt.Fprintln(out, strings.Join(lines, "\n"))
}
