package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/doctor"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// defaultCNIConfDir is where container runtimes read CNI network configs.
const defaultCNIConfDir = "/etc/cni/net.d"

func newDoctorCommand(g *GlobalFlags, kc kubeClient) *cobra.Command {
	var (
		h          hostFlags
		k          kubeFlags
		cfg        daemon.Config // built by PreRunE
		confDir    string
		healthAddr string
	)
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host's whole overlay path and say what to fix",
		Long: `Check, read only, everything a pod's packet to another host depends on here:
IP forwarding, reverse-path filtering on the underlay and overlay devices,
bridge netfilter where kube-proxy runs, FORWARD chains that drop the pod
network by policy, MTUs from the underlay to the pods' veths, other users of
the VXLAN port, checksum offload on kernels with the NAT checksum bug, every
route, neighbour and FDB entry against the leases in etcd, and subnet.env and
the CNI config directory against this host's lease.

One line per finding: ok, note (not applicable, or not fully visible), or
problem with what to do. Exits 0 when there is no problem, 1 otherwise.
Give it the host flags 'overlayd run' has (--iface, --public-ip,
--node-name, --subnet-file; or the same OVERLAY_* variables). It changes
nothing, on the host or in etcd.

In kube mode (--kube-subnet-mgr, with run's --kubeconfig-file or
--kube-api-url, --kube-annotation-prefix and --net-config-path) the network
config is the file and the leases are the Nodes' podCIDRs and annotations,
read with one listing of the Nodes (get and list on nodes: the manifest's
ClusterRole grants them); no etcd is used.`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) (err error) {
			if cfg, err = h.config(g, cmd.Flags(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			return k.check(cmd.Flags(), cfg.NodeName)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, snap, err := doctorLeases(cmd, g, &k, &cfg, kc)
			if err != nil {
				return err
			}
			facts, err := daemon.Diagnose(cfg, nc, snap, daemon.DiagnoseOptions{CNIConfDir: confDir,
				Health: statusHealth{ctx: ctx, addr: healthAddr, timeout: g.DialTimeout}})
			if err != nil {
				return err
			}
			findings := doctor.Run(&facts)
			if err := printer.Write(cmd.OutOrStdout(), g.out, doctorOutput(findings)); err != nil {
				return err
			}
			if n := problems(findings); n > 0 {
				return fmt.Errorf("%d %s found: fix %s as each line says, then run `overlayd doctor` again", n, plural(n, "problem", "problems"), plural(n, "it", "them"))
			}
			return nil
		},
	}
	h.register(c)
	c.Flags().Lookup("subnet-file").Usage = "the subnet.env overlayd run writes here (its --subnet-file), to check against the lease"
	c.Flags().StringVar(&healthAddr, "health-addr", daemon.DefaultHealthAddr, "the local overlayd's --health-addr, whose /status has the peers' health")
	checkFlag(c.Flags(), "health-addr", listenAddr(false))
	fromEnv(c.Flags(), "health-addr") // the local daemon's, as run reads it
	c.Flags().StringVar(&confDir, "cni-conf-dir", defaultCNIConfDir, "the container runtime's CNI config directory, whose first config must be overlay's")
	checkFlag(c.Flags(), "cni-conf-dir", absDir)
	k.register(c, false)
	return usesEtcd(c)
}

// doctorLeases reads the network config and every lease: from etcd, or in
// kube mode from the config file and the Nodes (subnet/kube.Read, in
// overlayd-kube).
func doctorLeases(cmd *cobra.Command, g *GlobalFlags, k *kubeFlags, cfg *daemon.Config, kc kubeClient) (*subnet.Config, subnet.Snapshot, error) {
	if k.enabled {
		if kc == nil {
			return nil, subnet.Snapshot{}, errNoKubeClient
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), g.DialTimeout) // one request, as each of etcd's
		defer cancel()
		return kc.read(ctx, k, cfg)
	}
	sess, err := g.open(cmd, true)
	if err != nil {
		return nil, subnet.Snapshot{}, err
	}
	defer sess.close()
	nc, _, err := sess.reg.GetConfig(sess.ctx)
	switch {
	case errors.Is(err, etcdv3.ErrNoConfig):
		return nil, subnet.Snapshot{}, fmt.Errorf("%w: store one with `overlayd config put -f FILE` (or check --prefix)", err)
	case err != nil:
		return nil, subnet.Snapshot{}, g.etcdHint(err)
	}
	snap, err := sess.reg.List(sess.ctx)
	if err != nil {
		return nil, subnet.Snapshot{}, g.etcdHint(err)
	}
	return nc, snap, nil
}

func problems(fs []doctor.Finding) int {
	n := 0
	for _, f := range fs {
		if f.Status == doctor.Problem {
			n++
		}
	}
	return n
}

// doctorReport is what `doctor -w json` prints.
type doctorReport struct {
	Clean    bool             `json:"clean"`
	Findings []doctor.Finding `json:"findings"`
}

// doctorOutput is one row per finding: status, check, what was found and,
// for a problem, what to do.
func doctorOutput(fs []doctor.Finding) printer.Output {
	out := printer.Output{Header: []string{"STATUS", "CHECK", "FINDING"}, JSON: doctorReport{Clean: doctor.Clean(fs), Findings: fs}}
	for _, f := range fs {
		msg := f.Message
		if f.Fix != "" {
			msg += "; fix: " + f.Fix
		}
		out.Rows = append(out.Rows, []string{string(f.Status), f.Check, msg})
	}
	return out
}

// statusHealth reads the per-peer health summary from the local
// overlayd's /status: every peer it reports unreachable, with since when
// and how many probes in a row it lost. A daemon that cannot be reached,
// or does not probe, has none to report (the check says so in a note;
// kernel-entries tells whether overlayd keeps the data path).
type statusHealth struct {
	ctx     context.Context
	addr    string
	timeout time.Duration
}

func (s statusHealth) PeerHealth() (*doctor.Health, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	st, err := fetchStatus(ctx, s.addr, true)
	if err != nil || st.PeerHealth == nil || !st.PeerHealth.Probing {
		return nil, nil
	}
	h := &doctor.Health{Reachable: st.PeerHealth.IPv4.Reachable + st.PeerHealth.IPv6.Reachable}
	for _, p := range st.PeerHealth.Peers {
		if p.State != peerhealth.Unreachable {
			continue
		}
		h.Unreachable = append(h.Unreachable, doctor.PeerHealth{Peer: p.Peer + " " + p.Family + " at " + p.PublicIP,
			Since: p.Since.Format(time.RFC3339), Loss: p.ConsecutiveLosses})
	}
	return h, nil
}
