package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"

	"github.com/overlaynet/overlay/internal/leaseadmin"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	"github.com/spf13/cobra"
)

func newConfigCommand(g *GlobalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "config",
		Short: "Show, store and validate the network config",
	}
	c.AddCommand(newConfigGetCommand(g), newConfigPutCommand(g), newConfigValidateCommand(g))
	return c
}

// configOutput shows the effective config: a field table, or its JSON
// (which `config put` accepts back). The table names fields as the JSON
// does and shows only the families the network carries, as the JSON does.
func configOutput(cfg *subnet.Config) printer.Output {
	var rows [][]string
	if cfg.EnableIPv4 {
		rows = poolRows("", "Subnets", &cfg.Pool)
	} else {
		rows = [][]string{{"EnableIPv4", "false"}}
	}
	if cfg.EnableIPv6 {
		rows = append(rows, []string{"EnableIPv6", "true"})
		rows = append(rows, poolRows("IPv6", "IPv6Subnets", &cfg.IPv6)...)
	}
	rows = append(rows,
		[]string{"Backend.Type", cfg.Backend.Type},
		[]string{"Backend.VNI", strconv.Itoa(cfg.Backend.VNI)},
		[]string{"Backend.Port", strconv.Itoa(cfg.Backend.Port)},
		[]string{"Backend.DirectRouting", strconv.FormatBool(cfg.Backend.DirectRouting)},
		[]string{"Backend.MTU", mtuText(cfg.Backend.MTU)},
	)
	rows = append(rows, keptRows("", cfg.Extra)...)
	rows = append(rows, keptRows("Backend.", cfg.Backend.Extra)...)
	return printer.Output{Header: []string{"FIELD", "VALUE"}, Rows: rows, JSON: cfg}
}

// keptRows show the members overlay keeps but does not act on (flanneld's
// EnableNFTables, Backend.GBP, unknown ones), as written.
func keptRows(prefix string, extra []subnet.Member) [][]string {
	var rows [][]string
	for _, m := range extra {
		value := string(m.Value)
		if strings.ContainsFunc(value, func(r rune) bool { return !unicode.IsPrint(r) }) {
			value = strconv.Quote(value) // etcd's bytes never reach a terminal raw
		}
		rows = append(rows, []string{subnet.ShownName(prefix + m.Name), value + " (kept, not used by overlay)"})
	}
	return rows
}

// poolRows are the rows of one family's pool, its fields named with prefix
// as in the JSON config, and how many subnets it holds.
func poolRows(prefix, countName string, p *subnet.Pool) [][]string {
	count := strconv.Itoa(p.Count())
	if p.Count() == math.MaxInt {
		count += " or more" // Count saturates for a huge IPv6 pool
	}
	return [][]string{
		{prefix + "Network", p.Network.String()},
		{prefix + "SubnetLen", strconv.Itoa(p.SubnetLen)},
		{prefix + "SubnetMin", p.SubnetMin.String()},
		{prefix + "SubnetMax", p.SubnetMax.String()},
		{countName, count},
	}
}

func mtuText(mtu int) string {
	if mtu == 0 {
		return "0 (underlay MTU - 50)"
	}
	return strconv.Itoa(mtu)
}

func newConfigGetCommand(g *GlobalFlags) *cobra.Command {
	var raw bool
	c := &cobra.Command{
		Use:   "get",
		Short: "Show the network config with defaults filled in (--raw: exactly as stored)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sess, err := g.open(cmd, false)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
			cfg, stored, err := reg.GetConfig(ctx)
			if raw && stored != nil {
				_, werr := cmd.OutOrStdout().Write(stored) // the stored bytes exactly: no newline added
				return werr
			}
			if err != nil {
				return g.etcdHint(err)
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().BoolVar(&raw, "raw", false, "print the stored bytes exactly as they are (even if invalid; no newline is added)")
	checkFlag(c.Flags(), "raw", boolean)
	return usesEtcd(c)
}

// readConfigFile reads -f FILE, or standard input for "-".
func readConfigFile(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "" {
		return nil, usagef("--file (-f) FILE is required (use - for standard input)")
	}
	var r io.Reader = cmd.InOrStdin()
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usagef("--file (-f) %s: cannot read it: %v", file, errors.Unwrap(err))
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, subnet.MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("read config file %s: %w", file, err)
	}
	return data, nil
}

// loadConfigFile reads -f FILE and validates it as a network config.
func loadConfigFile(cmd *cobra.Command, file string) ([]byte, *subnet.Config, error) {
	data, err := readConfigFile(cmd, file)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := subnet.ParseStorableConfig(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	return data, cfg, nil
}

func newConfigPutCommand(g *GlobalFlags) *cobra.Command {
	var (
		file  string
		force bool
	)
	c := &cobra.Command{
		Use:   "put -f FILE [--force]",
		Short: "Validate a network config and store it (unknown fields are kept); refuses to strand leases unless --force",
		Long: `Validate a network config and store it; unknown fields are kept.

A change of Network, SubnetLen, Backend.VNI or Backend.Port strands the
leases that no longer fit: their hosts lose their subnet or can no longer
reach the others. It is refused, naming those leases, unless --force.

Turning EnableIPv6 on or off (the IPv4 network unchanged) strands no
lease: store it, then restart overlayd host by host; each host's lease
gains or drops its IPv6 subnet at its restart, and IPv4 keeps flowing
between restarted hosts and the others meanwhile.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, next, err := loadConfigFile(cmd, file)
			if err != nil {
				return fmt.Errorf("%w; nothing was stored", err)
			}
			sess, err := g.open(cmd, false)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
			snap, err := reg.List(ctx)
			if err != nil {
				return g.etcdHint(err)
			}
			if err := checkUnderlayOutside(ctx, reg, next, snap.Leases, cmd.ErrOrStderr()); err != nil {
				return g.refusedOrHint("refusing to store the config: ", err)
			}
			prev, _, err := reg.GetConfig(ctx)
			switch {
			case errors.Is(err, etcdv3.ErrNoConfig), errors.Is(err, subnet.ErrInvalidConfig):
				prev = nil // nothing valid to compare with
			case err != nil:
				return g.etcdHint(err)
			}
			stranded := leaseadmin.StrandedLeases(prev, next, snap.Leases)
			for _, s := range stranded {
				fmt.Fprintf(cmd.ErrOrStderr(), "stranded: %s\n", s)
			}
			if len(stranded) > 0 && !force {
				return fmt.Errorf("refusing to store the config: it would strand %d %s held by %s (listed above); keep the old values, or stop overlayd on those hosts, run `overlayd config put --force`, revoke the stranded leases (`overlayd lease list` shows them as orphaned) and start overlayd again",
					len(stranded), plural(len(stranded), "lease", "leases"), leaseadmin.StrandedHosts(stranded))
			}
			cfg, err := reg.PutConfigIfUnchanged(ctx, data, snap.Revision)
			if errors.Is(err, etcdv3.ErrConflict) {
				return fmt.Errorf("%w; nothing was stored: run the command again", err)
			}
			if err != nil {
				return g.etcdHint(err)
			}
			if format == printer.Table {
				fmt.Fprintf(cmd.OutOrStdout(), "stored %s\n", reg.Keys.ConfigKey())
			}
			if advice := ipv6ToggleAdvice(prev, next); advice != "" && len(stranded) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), advice)
			}
			if len(stranded) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: stored with --force: %d %s stranded; revoke them with `overlayd lease revoke SUBNET` once their hosts run with the new config\n",
					len(stranded), plural(len(stranded), "lease", "leases"))
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (JSON), - for standard input")
	c.Flags().BoolVar(&force, "force", false, "store even if leases would be stranded (never from the environment)")
	checkFlag(c.Flags(), "file", inputFile)
	checkFlag(c.Flags(), "force", boolean)
	return usesEtcd(c)
}

// ipv6ToggleAdvice is what to do after storing next over prev when the
// change turns IPv6 on or off in a network that carries IPv4 (no lease
// is stranded by that alone: hosts program the IPv4 half of each other's
// keys until every host has restarted, see subnet.Config.IPv4Only); ""
// for any other change.
func ipv6ToggleAdvice(prev, next *subnet.Config) string {
	if prev == nil || !prev.EnableIPv4 || !next.EnableIPv4 || prev.EnableIPv6 == next.EnableIPv6 {
		return ""
	}
	if next.EnableIPv6 {
		return fmt.Sprintf("note: EnableIPv6 false -> true: restart overlayd host by host (each host needs a global IPv6 address on its underlay, or --public-ipv6); each host's lease gains an IPv6 subnet of %s when it restarts, keeping its IPv4 subnet. IPv4 keeps flowing meanwhile; `overlayd lease list` shows the leases of hosts not yet restarted as ipv4-only. Nothing to revoke", next.IPv6.Network)
	}
	return "note: EnableIPv6 true -> false: restart overlayd host by host; each host drops its lease's IPv6 subnet and removes its IPv6 device when it restarts, keeping its IPv4 subnet. IPv4 keeps flowing meanwhile; `overlayd lease list` shows the leases of hosts not yet restarted as ipv4-only. Nothing to revoke"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func newConfigValidateCommand(g *GlobalFlags) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "validate -f FILE",
		Short: "Check a network config file and print the effective config; with --endpoints (or OVERLAY_ENDPOINTS), also against the cluster's hosts",
		Long: `Check a network config file and print the effective config (defaults
filled in). Without etcd flags it checks the file alone: no etcd is needed.

With --endpoints (or OVERLAY_ENDPOINTS) it also checks the config against
the cluster there, as config put does before it stores one: a network that
holds the underlay address of a host with a lease, a reservation or a
liveness key is refused. If that etcd cannot be used, it says so in a
warning and checks the file alone.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			_, cfg, err := loadConfigFile(cmd, file)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("endpoints") {
				if err := g.checkAgainstCluster(cmd, cfg); err != nil {
					return err
				}
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (JSON), - for standard input")
	checkFlag(c.Flags(), "file", inputFile)
	return c
}

// checkAgainstCluster is config validate's check of a valid config
// against the hosts of the cluster --endpoints names. An etcd it cannot
// use does not fail the check of the file: it is a warning saying what
// was not checked, and why.
func (g *GlobalFlags) checkAgainstCluster(cmd *cobra.Command, cfg *subnet.Config) error {
	warn := func(err error) error {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: the file is valid, but it was not checked against the cluster: %v\n", err)
		return nil
	}
	if err := g.validateEtcdFlags(cmd.Flags()); err != nil {
		return err
	}
	sess, err := g.open(cmd, false)
	if err != nil {
		return warn(err)
	}
	defer sess.close()
	ctx, reg := sess.ctx, sess.reg
	if err := checkUnderlayOutside(ctx, reg, cfg, nil, cmd.ErrOrStderr()); err != nil {
		var refused leaseadmin.Refusal
		if errors.As(err, &refused) {
			return fmt.Errorf("the config does not fit the cluster at %s: %w", strings.Join(g.Endpoints, ","), refused.Err)
		}
		return warn(g.etcdHint(err))
	}
	return nil
}
