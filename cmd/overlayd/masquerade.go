package main

import (
	"fmt"
	"net"
	"strings"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
)

func newMasqueradeCommand(g *GlobalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "masquerade",
		Short: "Manage overlayd's masquerade table on this host",
	}
	c.AddCommand(newMasqueradeInstallCommand(g))
	return c
}

func newMasqueradeInstallCommand(g *GlobalFlags) *cobra.Command {
	var netConf string
	c := usesEtcd(&cobra.Command{
		Use:   "install",
		Short: "Install overlayd's masquerade table for the stored network now, e.g. before stopping flanneld",
		Long: `Install overlayd's nftables table "inet overlay" for the network config
stored in etcd — or, with --net-config-path, for the network config file of
kube mode (the ConfigMap's net-conf.json) —, as 'overlayd run --ip-masq'
keeps it, and exit.

Before a host is taken over from flanneld (overlayd run --adopt-flannel), run
this while flanneld still runs: some flanneld versions delete their
masquerade rules when they stop, and with overlayd's table already in place
pod traffic to the outside is masqueraded at every moment. Both tables
masquerading the same traffic at once is harmless: a connection is NATed
once, by the first rule it meets. overlayd run keeps the table from then on;
overlayd teardown removes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			var cfg *subnet.Config
			if netConf != "" {
				var err error
				if _, cfg, err = subnet.ReadNetConf(netConf); err != nil {
					return err
				}
			} else {
				sess, err := g.open(cmd, false)
				if err != nil {
					return err
				}
				defer sess.close()
				if cfg, _, err = sess.reg.GetConfig(sess.ctx); err != nil {
					return g.etcdHint(err)
				}
			}
			m, err := masq.NewNetworks(masqNetworks(cfg))
			if err != nil {
				return err
			}
			defer m.Close()
			if _, err := m.Ensure(); err != nil {
				return fmt.Errorf("install the nftables table inet %s: %w", masq.TableName, err)
			}
			if format == printer.Table {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "installed nftables table inet %s for %s\n", masq.TableName, describeNetworks(cfg))
				return err
			}
			// -w json and -w simple: the table and the networks it masquerades for.
			installed := struct {
				Table    string   `json:"table"`
				Networks []string `json:"networks"`
			}{"inet " + masq.TableName, networkList(cfg)}
			row := append([]string{"installed", installed.Table}, installed.Networks...)
			return printer.Write(cmd.OutOrStdout(), format, printer.Output{Rows: [][]string{row}, JSON: installed})
		},
	})
	c.Flags().StringVar(&netConf, "net-config-path", "", "kube mode: install for this network config file (the ConfigMap's net-conf.json, as overlayd run --kube-subnet-mgr reads it) instead of the config stored in etcd")
	checkFlag(c.Flags(), "net-config-path", absFile)
	return c
}

// masqNetworks are cfg's networks, each with the VXLAN device that
// carries it on this host: flanneld's, while it is there.
func masqNetworks(cfg *subnet.Config) []masq.Network {
	fl4, fl6 := daemon.FlannelDeviceNames(cfg.Backend.VNI)
	device := func(flannel, ours string) string {
		if _, err := net.InterfaceByName(flannel); err == nil {
			return flannel
		}
		return ours
	}
	var nets []masq.Network
	if cfg.EnableIPv4 {
		nets = append(nets, masq.Network{Prefix: cfg.Network, Device: device(fl4, vxlan.DeviceName(cfg.Backend.VNI))})
	}
	if cfg.EnableIPv6 {
		nets = append(nets, masq.Network{Prefix: cfg.IPv6.Network, Device: device(fl6, vxlan.DeviceNameV6(cfg.Backend.VNI))})
	}
	return nets
}

// describeNetworks names cfg's cluster networks.
func describeNetworks(cfg *subnet.Config) string { return strings.Join(networkList(cfg), " and ") }

// networkList is cfg's cluster networks, IPv4 first.
func networkList(cfg *subnet.Config) []string {
	var nets []string
	if cfg.EnableIPv4 {
		nets = append(nets, cfg.Network.String())
	}
	if cfg.EnableIPv6 {
		nets = append(nets, cfg.IPv6.Network.String())
	}
	return nets
}
