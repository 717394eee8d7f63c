package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/internal/leaseadmin"
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
	Subnet   string `json:"subnet"`
	PublicIP string `json:"publicIP"`
	VtepMAC  string `json:"vtepMAC"`
	// The IPv6 half of a dual-stack key, omitted for an IPv4-only one so
	// that its JSON stays as it was.
	IPv6Subnet string `json:"ipv6Subnet,omitempty"`
	PublicIPv6 string `json:"publicIPv6,omitempty"`
	VtepMACv6  string `json:"vtepMACv6,omitempty"`
	NodeID     string `json:"nodeID"`
	Hostname   string `json:"hostname,omitempty"`
	Reserved   bool   `json:"reserved"`
	TTLSeconds int64  `json:"ttlSeconds"` // -1 for a reservation
	Alive      string `json:"alive"`      // yes, no, or unknown (a lease without NodeID)
	EtcdLease  string `json:"etcdLease,omitempty"`
	Revision   int64  `json:"modRevision"`
	// State is what the daemons make of the key (see leaseadmin.State).
	State   string `json:"state"`
	Problem string `json:"problem,omitempty"` // why it is orphaned or invalid, or why only its IPv4 half is used
}

type invalidRow struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

var (
	leaseHeader = []string{"SUBNET", "PUBLIC IP", "VTEP MAC", "NODE", "TTL", "ALIVE", "STATE"}
	// ipv6Header are the columns of a key's IPv6 half. They come last, so
	// the first seven columns keep their places (for scripts reading
	// `-w simple`) whether a network carries IPv6 or not.
	ipv6Header = []string{"IPV6 SUBNET", "PUBLIC IPV6", "IPV6 VTEP MAC"}
	// ipv6OnlyHeader are the columns of an IPv6-only network, whose keys
	// have no IPv4 half: the same places, filled with the IPv6 values.
	ipv6OnlyHeader = []string{"SUBNET", "PUBLIC IPV6", "VTEP MAC", "NODE", "TTL", "ALIVE", "STATE"}
)

// leaseTable is rows as a table: the IPv6 columns only when the network
// carries IPv6 (cfg nil: unknown) or some key names an IPv6 subnet or
// address, so the output of an IPv4-only network is as it always was.
func leaseTable(cfg *subnet.Config, rows []leaseRow) printer.Output {
	if cfg != nil && !cfg.EnableIPv4 {
		out := printer.Output{Header: ipv6OnlyHeader}
		for _, r := range rows {
			cells := r.cells()
			cells[0], cells[1], cells[2] = orNone(r.IPv6Subnet), orNone(r.PublicIPv6), orNone(r.VtepMACv6)
			out.Rows = append(out.Rows, cells)
		}
		return out
	}
	v6 := cfg != nil && cfg.EnableIPv6 || slices.ContainsFunc(rows, func(r leaseRow) bool { return r.IPv6Subnet != "" || r.PublicIPv6 != "" })
	out := printer.Output{Header: leaseHeader}
	if v6 {
		out.Header = slices.Concat(leaseHeader, ipv6Header)
	}
	for _, r := range rows {
		cells := r.cells()
		if v6 {
			cells = append(cells, orNone(r.IPv6Subnet), orNone(r.PublicIPv6), orNone(r.VtepMACv6))
		}
		out.Rows = append(out.Rows, cells)
	}
	return out
}

func (r leaseRow) cells() []string {
	ttl := "reserved"
	if !r.Reserved {
		ttl = (time.Duration(r.TTLSeconds) * time.Second).String()
		if r.TTLSeconds < 0 {
			ttl = "expired"
		}
	}
	return []string{orNone(r.Subnet), orNone(r.PublicIP), orNone(r.VtepMAC), orNone(r.NodeID), ttl, r.Alive, r.State}
}

// subnets names the row's key as people read it: "10.244.7.0/24", or
// "10.244.7.0/24&fd00:10:244:7::/64" for a dual-stack key.
func (r leaseRow) subnets() string {
	return strings.Join(slices.DeleteFunc([]string{r.Subnet, r.IPv6Subnet}, func(s string) bool { return s == "" }), "&")
}

// prefixString is p in CIDR form, or "" for a half the key does not name.
func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// orDash is s, or "-" for none, within a cell's text.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// orNone is s as a whole cell, or printer.None (printed "-") for none: a
// value that is literally "-" is then told from none in -w simple.
func orNone(s string) string {
	if s == "" {
		return printer.None
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
		return a.Subnets().Compare(b.Subnets())
	})
	rows := make([]leaseRow, 0, len(leases))
	for _, l := range leases {
		row := leaseRow{Subnet: prefixString(l.Subnet), IPv6Subnet: prefixString(l.IPv6Subnet), PublicIP: l.Attrs.PublicIP, PublicIPv6: l.Attrs.PublicIPv6, NodeID: l.Attrs.NodeID,
			Hostname: l.Attrs.Hostname, Reserved: l.Reserved, TTLSeconds: -1, Alive: "unknown", Revision: l.ModRevision}
		if mac, ok := codecs.LeaseVtepMAC(l.Attrs.BackendData, "BackendData"); ok {
			row.VtepMAC = mac
		}
		if mac, ok := codecs.LeaseVtepMAC(l.Attrs.BackendV6Data, "BackendV6Data"); ok {
			row.VtepMACv6 = mac
		}
		if !l.Reserved {
			row.TTLSeconds = ttls[l.EtcdLease]
			row.EtcdLease = strconv.FormatInt(l.EtcdLease, 16)
		}
		row.Alive = aliveText(l.Attrs, alive)
		row.State, row.Problem = leaseadmin.State(cfg, l)
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
	// Each request waits up to --dial-timeout: after one fails, the rest
	// are cancelled rather than each waiting its turn for an etcd that is
	// gone.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
				cancel()
			}
			ttls[id] = ttl
		})
	}
	wg.Wait()
	return ttls, firstErr
}

// aliveText says whether the host a lease names is alive: yes or no by
// its node ID's liveness key, unknown for a lease without a node ID
// (written by flanneld, or a reservation naming only addresses).
func aliveText(a subnet.LeaseAttrs, alive map[string]bool) string {
	if a.NodeID == "" {
		return "unknown"
	}
	return yesNo(alive[a.NodeID])
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
		Short: "List every lease: subnet, public IP, VTEP MAC, node, TTL left or reserved, alive, state (and the IPv6 subnet and public IPv6 in a dual-stack network)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sess, err := g.open(cmd, true)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
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
					switch {
					case r.State == leaseadmin.StateIPv4Only:
						fmt.Fprintf(cmd.ErrOrStderr(), "note: %s is %s: %s: nothing to revoke\n", r.subnets(), r.State, r.Problem)
					case r.Problem != "":
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s is %s: %s: daemons skip it; remove it with `overlayd lease revoke %s`\n", r.subnets(), r.State, r.Problem, cmp.Or(r.Subnet, r.IPv6Subnet))
					}
				}
			}
			invalid := make([]invalidRow, 0, len(snap.Invalid))
			for _, inv := range snap.Invalid {
				invalid = append(invalid, invalidRow{Key: inv.Key, Error: inv.Err.Error()})
				if format != printer.JSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipping %s: %v\n", leaseadmin.PlainKey(inv.Key), inv.Err)
				}
			}
			out := leaseTable(cfg, rows)
			out.JSON = struct {
				Revision int64        `json:"revision"`
				Leases   []leaseRow   `json:"leases"`
				Invalid  []invalidRow `json:"invalid"`
			}{snap.Revision, rows, invalid}
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

// parseSubnetArg accepts a subnet of either family, 10.244.7.0/24 or
// fd00:10:244:7::/64, or its key form 10.244.7.0-24.
func parseSubnetArg(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return netip.Prefix{}, usagef("subnet %q: want a network address such as %s", s, p.Masked())
		}
		return p, nil
	}
	sn, err := subnet.ParseLeaseKey(s)
	if err != nil || sn.IPv6.IsValid() {
		return netip.Prefix{}, usagef("subnet %q: want a subnet such as 10.244.7.0/24 or fd00:10:244:7::/64", s)
	}
	return sn.IPv4, nil
}

func newLeaseGetCommand(g *GlobalFlags) *cobra.Command {
	return usesEtcd(&cobra.Command{
		Use:   "get SUBNET",
		Short: "Show one lease (SUBNET as 10.244.7.0/24, 10.244.7.0-24, or its IPv6 subnet)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			sess, err := g.open(cmd, true)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
			l, err := lookup(ctx, reg, p)
			if errors.Is(err, etcdv3.ErrNotFound) {
				return err
			}
			if errors.Is(err, subnet.ErrInvalidLease) && l.Subnets() != (subnet.Subnets{}) {
				return invalidValue(ctx, reg, l, p, err)
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
			out := leaseTable(cfg, rows)
			out.JSON = rows[0]
			return printer.Write(cmd.OutOrStdout(), format, out)
		},
	})
}

// invalidValue explains a lease whose value does not decode (err): its
// key, why, the value as stored (quoted, shortened) and what to do.
func invalidValue(ctx context.Context, reg *etcdv3.Registry, l subnet.Lease, p netip.Prefix, err error) error {
	key := reg.Keys.LeaseKey(l.Subnets())
	value := "(cannot be read again)"
	if resp, gerr := reg.Client().Get(ctx, key); gerr == nil && len(resp.Kvs) == 1 {
		value = shownValue(resp.Kvs[0].Value)
	}
	return fmt.Errorf("%s holds a value no host can use: %w; the value is %s: daemons skip it; remove it with `overlayd lease revoke %s`", key, err, value, p)
}

// shownValue quotes a value read from etcd, shortened to stay one line.
func shownValue(v []byte) string {
	const limit = 80
	if len(v) > limit {
		return strconv.Quote(string(v[:limit])) + fmt.Sprintf(" (%d bytes in all)", len(v))
	}
	return strconv.Quote(string(v))
}

// lookup finds the lease whose key names p, of either family. Like
// Registry.Lookup it returns an undecodable value's lease with its error;
// a missing one is ErrNotFound, with where to look.
func lookup(ctx context.Context, reg *etcdv3.Registry, p netip.Prefix) (subnet.Lease, error) {
	l, err := reg.Lookup(ctx, p)
	if errors.Is(err, etcdv3.ErrNotFound) {
		return l, fmt.Errorf("%w (list leases with `overlayd lease list`)", err)
	}
	return l, err
}
