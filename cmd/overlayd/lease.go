package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

func newLeaseCommand(g *GlobalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "lease",
		Short: "List, inspect, reserve and revoke subnet leases",
	}
	c.AddCommand(newLeaseListCommand(g), newLeaseGetCommand(g), newLeaseReserveCommand(g), newLeaseRevokeCommand(g))
	return c
}

// leaseRow is one lease as the CLI shows it (also its JSON form).
type leaseRow struct {
	Subnet     string `json:"subnet"`
	PublicIP   string `json:"publicIP"`
	VtepMAC    string `json:"vtepMAC"`
	NodeID     string `json:"nodeID"`
	Hostname   string `json:"hostname,omitempty"`
	Reserved   bool   `json:"reserved"`
	TTLSeconds int64  `json:"ttlSeconds"` // -1 for a reservation
	Alive      string `json:"alive"`      // yes, no, or unknown (a lease without NodeID)
	EtcdLease  string `json:"etcdLease,omitempty"`
	Revision   int64  `json:"modRevision"`
	// State is what the daemons make of the key (see leaseState).
	State   string `json:"state"`
	Problem string `json:"problem,omitempty"` // why it is orphaned or invalid
}

// Lease states, as `lease list` shows them.
const (
	stateLeased   = "leased"   // a host's lease, with a TTL
	stateReserved = "reserved" // a reservation, adopted or waiting for its host
	stateOrphaned = "orphaned" // does not fit the network config: no host can use it
	stateInvalid  = "invalid"  // daemons skip it (bad address, MAC, ...)
	stateUnknown  = "unknown"  // no valid network config to judge it by
)

// leaseState judges l as every daemon does (Config.Peer, or CheckClaim for
// a reservation no host has adopted yet). cfg nil: no valid config.
func leaseState(cfg *subnet.Config, l subnet.Lease) (state, problem string) {
	if cfg == nil {
		return stateUnknown, ""
	}
	var err error
	if l.Unclaimed() {
		err = cfg.CheckClaim(l)
	} else {
		_, _, err = cfg.Peer(l)
	}
	switch {
	case errors.Is(err, subnet.ErrOrphaned):
		return stateOrphaned, err.Error()
	case err != nil:
		return stateInvalid, err.Error()
	case l.Reserved:
		return stateReserved, ""
	}
	return stateLeased, ""
}

type invalidRow struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

var leaseHeader = []string{"SUBNET", "PUBLIC IP", "VTEP MAC", "NODE", "TTL", "ALIVE", "STATE"}

func (r leaseRow) cells() []string {
	ttl := "reserved"
	if !r.Reserved {
		ttl = (time.Duration(r.TTLSeconds) * time.Second).String()
		if r.TTLSeconds < 0 {
			ttl = "expired"
		}
	}
	return []string{r.Subnet, orDash(r.PublicIP), orDash(r.VtepMAC), orDash(r.NodeID), ttl, r.Alive, r.State}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// leaseRows builds rows for leases, looking up TTLs (with bounded
// parallelism: one etcd request per distinct etcd lease) and liveness, and
// judging each by cfg (nil: no valid config).
func leaseRows(ctx context.Context, reg *etcdv3.Registry, cfg *subnet.Config, leases []subnet.Lease) ([]leaseRow, error) {
	alive, err := reg.AliveNodes(ctx)
	if err != nil {
		return nil, err
	}
	ttls, err := leaseTTLs(ctx, reg, leases)
	if err != nil {
		return nil, err
	}
	// etcd returns keys in string order (10.244.156.0 before 10.244.42.0);
	// people expect address order.
	leases = slices.SortedFunc(slices.Values(leases), func(a, b subnet.Lease) int {
		return a.Subnet.Addr().Compare(b.Subnet.Addr())
	})
	rows := make([]leaseRow, 0, len(leases))
	for _, l := range leases {
		row := leaseRow{Subnet: l.Subnet.String(), PublicIP: l.Attrs.PublicIP, NodeID: l.Attrs.NodeID,
			Hostname: l.Attrs.Hostname, Reserved: l.Reserved, TTLSeconds: -1, Alive: "unknown", Revision: l.ModRevision}
		if d, err := l.Attrs.VXLAN(); err == nil {
			row.VtepMAC = d.VtepMAC
		}
		if !l.Reserved {
			row.TTLSeconds = ttls[l.EtcdLease]
			row.EtcdLease = strconv.FormatInt(l.EtcdLease, 16)
		}
		if l.Attrs.NodeID != "" {
			row.Alive = yesNo(alive[l.Attrs.NodeID])
		}
		row.State, row.Problem = leaseState(cfg, l)
		rows = append(rows, row)
	}
	return rows, nil
}

func leaseTTLs(ctx context.Context, reg *etcdv3.Registry, leases []subnet.Lease) (map[int64]int64, error) {
	ttls := map[int64]int64{}
	var ids []int64
	for _, l := range leases {
		if _, seen := ttls[l.EtcdLease]; !l.Reserved && !seen {
			ttls[l.EtcdLease] = -1
			ids = append(ids, l.EtcdLease)
		}
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, 16)
	)
	for _, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ttl, err := reg.TTL(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			ttls[id] = ttl
		})
	}
	wg.Wait()
	return ttls, firstErr
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newLeaseListCommand(g *GlobalFlags) *cobra.Command {
	return usesEtcd(&cobra.Command{
		Use:   "list",
		Short: "List every lease: subnet, public IP, VTEP MAC, node, TTL left or reserved, alive, state",
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
			snap, err := reg.List(ctx)
			if err != nil {
				return g.etcdHint(err)
			}
			cfg, err := networkConfig(ctx, g, reg, cmd.ErrOrStderr(), format)
			if err != nil {
				return err
			}
			rows, err := leaseRows(ctx, reg, cfg, snap.Leases)
			if err != nil {
				return g.etcdHint(err)
			}
			if format != printer.JSON {
				for _, r := range rows {
					if r.Problem != "" {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s is %s: %s: daemons skip it; remove it with `overlayd lease revoke %s`\n", r.Subnet, r.State, r.Problem, r.Subnet)
					}
				}
			}
			invalid := make([]invalidRow, 0, len(snap.Invalid))
			for _, inv := range snap.Invalid {
				invalid = append(invalid, invalidRow{Key: inv.Key, Error: inv.Err.Error()})
				if format != printer.JSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipping %s: %v\n", inv.Key, inv.Err)
				}
			}
			out := printer.Output{Header: leaseHeader, JSON: struct {
				Revision int64        `json:"revision"`
				Leases   []leaseRow   `json:"leases"`
				Invalid  []invalidRow `json:"invalid"`
			}{snap.Revision, rows, invalid}}
			for _, r := range rows {
				out.Rows = append(out.Rows, r.cells())
			}
			return printer.Write(cmd.OutOrStdout(), format, out)
		},
	})
}

// networkConfig reads the config leases are judged by; without a valid one
// it warns (unless format is JSON) and returns nil.
func networkConfig(ctx context.Context, g *GlobalFlags, reg *etcdv3.Registry, warn io.Writer, format printer.Format) (*subnet.Config, error) {
	cfg, _, err := reg.GetConfig(ctx)
	switch {
	case errors.Is(err, etcdv3.ErrNoConfig), errors.Is(err, subnet.ErrInvalidConfig):
		if format != printer.JSON {
			fmt.Fprintf(warn, "warning: cannot judge leases (STATE unknown): %v\n", err)
		}
		return nil, nil
	case err != nil:
		return nil, g.etcdHint(err)
	}
	return cfg, nil
}

// parseSubnetArg accepts 10.244.7.0/24 or the key form 10.244.7.0-24.
func parseSubnetArg(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p != p.Masked() || !p.Addr().Is4() {
			return netip.Prefix{}, usagef("subnet %q: want an IPv4 network address such as %s", s, p.Masked())
		}
		return p, nil
	}
	p, err := subnet.ParseKey(s)
	if err != nil {
		return netip.Prefix{}, usagef("subnet %q: want a subnet such as 10.244.7.0/24", s)
	}
	return p, nil
}

func newLeaseGetCommand(g *GlobalFlags) *cobra.Command {
	return usesEtcd(&cobra.Command{
		Use:   "get SUBNET",
		Short: "Show one lease (SUBNET as 10.244.7.0/24 or 10.244.7.0-24)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			p, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			l, err := reg.Get(ctx, p)
			if errors.Is(err, etcdv3.ErrNotFound) {
				return fmt.Errorf("%w (list leases with `overlayd lease list`)", err)
			}
			if err != nil {
				return g.etcdHint(err)
			}
			cfg, err := networkConfig(ctx, g, reg, cmd.ErrOrStderr(), format)
			if err != nil {
				return err
			}
			rows, err := leaseRows(ctx, reg, cfg, []subnet.Lease{l})
			if err != nil {
				return g.etcdHint(err)
			}
			return printer.Write(cmd.OutOrStdout(), format, printer.Output{Header: leaseHeader, Rows: [][]string{rows[0].cells()}, JSON: rows[0]})
		},
	})
}
