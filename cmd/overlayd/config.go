package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

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
	return printer.Output{Header: []string{"FIELD", "VALUE"}, Rows: rows, JSON: cfg}
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
			format, err := g.format()
			if err != nil {
				return err
			}
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
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
	cfg, err := subnet.ParseConfig(data)
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
reach the others. It is refused, naming those leases, unless --force.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			data, next, err := loadConfigFile(cmd, file)
			if err != nil {
				return fmt.Errorf("%w; nothing was stored", err)
			}
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			snap, err := reg.List(ctx)
			if err != nil {
				return g.etcdHint(err)
			}
			prev, _, err := reg.GetConfig(ctx)
			switch {
			case errors.Is(err, etcdv3.ErrNoConfig), errors.Is(err, subnet.ErrInvalidConfig):
				prev = nil // nothing valid to compare with
			case err != nil:
				return g.etcdHint(err)
			}
			stranded := strandedLeases(prev, next, snap.Leases)
			for _, s := range stranded {
				fmt.Fprintf(cmd.ErrOrStderr(), "stranded: %s\n", s)
			}
			if len(stranded) > 0 && !force {
				return fmt.Errorf("refusing to store the config: it would strand %d %s held by %s (listed above); keep the old values, or stop overlayd on those hosts, run `overlayd config put --force`, revoke the stranded leases (`overlayd lease list` shows them as orphaned) and start overlayd again",
					len(stranded), plural(len(stranded), "lease", "leases"), strandedHosts(stranded))
			}
			cfg, err := reg.PutConfigIfUnchanged(ctx, data, snap.Revision)
			if errors.Is(err, etcdv3.ErrConflict) {
				return fmt.Errorf("%w; nothing was stored: run the command again", err)
			}
			if err != nil {
				return g.etcdHint(err)
			}
			if format == printer.Table {
				fmt.Fprintf(cmd.OutOrStdout(), "stored %s\n", reg.ConfigKey())
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

// strandedLease is a lease that fits the stored config but not the new one.
type strandedLease struct {
	lease  subnet.Lease
	reason string
}

func (s strandedLease) String() string {
	return fmt.Sprintf("%s of %s: %s", s.lease.Subnets(), describeOwner(s.lease.Attrs), s.reason)
}

// strandedLeases returns the leases the change from prev (nil: none
// stored) to next would strand: those next's Orphaned refuses, the same
// check every daemon makes, and — when Backend.Port changes — every
// lease a host has claimed, as hosts on different ports cannot reach
// each other.
func strandedLeases(prev, next *subnet.Config, leases []subnet.Lease) []strandedLease {
	var out []strandedLease
	leases = slices.SortedFunc(slices.Values(leases), func(a, b subnet.Lease) int { return a.Subnets().Compare(b.Subnets()) })
	for _, l := range leases {
		if prev != nil && prev.Orphaned(l) != nil {
			continue // already orphaned: nothing changes for it
		}
		if err := next.Orphaned(l); err != nil {
			out = append(out, strandedLease{l, strings.TrimPrefix(err.Error(), subnet.ErrOrphaned.Error()+": ")})
			continue
		}
		if prev != nil && prev.Backend.Port != next.Backend.Port && !l.Unclaimed() {
			out = append(out, strandedLease{l, fmt.Sprintf("its host sends VXLAN to port %d, Backend.Port %d would be used by restarted hosts", prev.Backend.Port, next.Backend.Port)})
		}
	}
	return out
}

func strandedHosts(ss []strandedLease) string {
	var hosts []string
	for _, s := range ss {
		hosts = append(hosts, describeOwner(s.lease.Attrs))
	}
	if len(hosts) > 5 {
		hosts = append(hosts[:5], fmt.Sprintf("%d more", len(hosts)-5))
	}
	return strings.Join(hosts, ", ")
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
		Short: "Check a network config file without contacting etcd; prints the effective config",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			_, cfg, err := loadConfigFile(cmd, file)
			if err != nil {
				return err
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (JSON), - for standard input")
	checkFlag(c.Flags(), "file", inputFile)
	return c
}
