package main

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
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
// (which `config put` accepts back).
func configOutput(cfg *subnet.Config) printer.Output {
	rows := [][]string{
		{"Network", cfg.Network.String()},
		{"SubnetLen", strconv.Itoa(cfg.SubnetLen)},
		{"SubnetMin", cfg.SubnetMin.String()},
		{"SubnetMax", cfg.SubnetMax.String()},
		{"Subnets", strconv.Itoa(cfg.Count())},
		{"Backend.Type", cfg.Backend.Type},
		{"Backend.VNI", strconv.Itoa(cfg.Backend.VNI)},
		{"Backend.Port", strconv.Itoa(cfg.Backend.Port)},
		{"Backend.DirectRouting", strconv.FormatBool(cfg.Backend.DirectRouting)},
		{"Backend.MTU", mtuText(cfg.Backend.MTU)},
	}
	return printer.Output{Header: []string{"FIELD", "VALUE"}, Rows: rows, JSON: cfg}
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
				_, werr := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", stored)
				return werr
			}
			if err != nil {
				return g.etcdHint(err)
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().BoolVar(&raw, "raw", false, "print the stored JSON unchanged (even if invalid)")
	return c
}

// readConfigFile reads -f FILE, or standard input for "-".
func readConfigFile(cmd *cobra.Command, file string) ([]byte, error) {
	if file == "" {
		return nil, usagef("-f FILE is required (use - for standard input)")
	}
	var r io.Reader = cmd.InOrStdin()
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("read config file: %w", err)
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
	var file string
	c := &cobra.Command{
		Use:   "put -f FILE",
		Short: "Validate a network config and store it (unknown fields are kept)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			data, _, err := loadConfigFile(cmd, file)
			if err != nil {
				return fmt.Errorf("%w; nothing was stored", err)
			}
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			cfg, err := reg.PutConfig(ctx, data)
			if err != nil {
				return g.etcdHint(err)
			}
			if format == printer.Table {
				fmt.Fprintf(cmd.OutOrStdout(), "stored %s\n", reg.ConfigKey())
			}
			return printer.Write(cmd.OutOrStdout(), format, configOutput(cfg))
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "config file (JSON), - for standard input")
	return c
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
	return c
}
