package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/spf13/cobra"
)

func newStatusCommand(g *GlobalFlags) *cobra.Command {
	var addr string
	c := &cobra.Command{
		Use:   "status",
		Short: "Show this host's lease, device, peers and readiness, from the local overlayd",
		Long: `Ask the overlayd running on this host (its --health-addr) for its state: the
lease, public IP, VXLAN device (in a dual-stack network also the IPv6 subnet,
public IPv6 and IPv6 device), peers programmed versus expected, and each
readiness condition with the reason it fails. Exits 1 if the daemon is not
ready or cannot be reached.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			ctx, cancel := context.WithTimeout(cmd.Context(), g.DialTimeout)
			defer cancel()
			st, err := fetchStatus(ctx, addr)
			if err != nil {
				return err
			}
			if err := printer.Write(cmd.OutOrStdout(), format, statusOutput(st)); err != nil {
				return err
			}
			if !st.Ready {
				return fmt.Errorf("overlayd is not ready (see the conditions above)")
			}
			return nil
		},
	}
	c.Flags().StringVar(&addr, "health-addr", daemon.DefaultHealthAddr, "the local overlayd's --health-addr")
	checkFlag(c.Flags(), "health-addr", listenAddr(false))
	fromEnv(c.Flags(), "health-addr") // the local daemon's, as run reads it
	return c
}

func fetchStatus(ctx context.Context, addr string) (daemon.Status, error) {
	var st daemon.Status
	url := "http://" + addr + "/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return st, usagef("--health-addr %q: %v", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("cannot reach overlayd at %s: %w: is `overlayd run` running here, and with this --health-addr?", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("overlayd at %s answered %s", url, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("decode status from %s: %w", url, err)
	}
	return st, nil
}

func statusOutput(st daemon.Status) printer.Output {
	// The IPv6 data plane's rows, each beside its IPv4 one, only when the
	// daemon reports it: an IPv4-only host's output stays as it was. An
	// IPv6-only host (no IPv4 subnet) shows only its IPv6 rows, the
	// lease's expiry on its IPv6 subnet.
	v6only := st.Subnet == "" && st.IPv6Subnet != ""
	rows := [][]string{{"node", st.Node}}
	if !v6only {
		rows = append(rows, []string{"public IP", orDash(st.PublicIP) + " (" + orDash(st.Iface) + ")"})
	}
	if st.PublicIPv6 != "" {
		rows = append(rows, []string{"public IPv6", st.PublicIPv6 + " (" + orDash(st.Iface) + ")"})
	}
	switch {
	case v6only:
		rows = append(rows, []string{"IPv6 subnet", st.IPv6Subnet + leaseNote(st)})
	case st.IPv6Subnet != "":
		rows = append(rows, []string{"subnet", orDash(st.Subnet) + leaseNote(st)}, []string{"IPv6 subnet", st.IPv6Subnet})
	default:
		rows = append(rows, []string{"subnet", orDash(st.Subnet) + leaseNote(st)})
	}
	if !v6only || st.Device != "" {
		rows = append(rows, []string{"device", deviceLine(st.Device, st.MTU, st.VtepMAC)})
	}
	if st.DeviceV6 != "" {
		rows = append(rows, []string{"IPv6 device", deviceLine(st.DeviceV6, st.MTUv6, st.VtepMACv6)})
	}
	rows = append(rows,
		[]string{"peers", fmt.Sprintf("%d programmed / %d expected", st.PeersProgrammed, st.PeersExpected) + ipv4OnlyNote(st.PeersIPv4Only)},
		[]string{"other leases", fmt.Sprintf("%d reserved, %d orphaned, %d invalid", st.LeasesReserved, st.LeasesOrphaned, st.LeasesRejected)})
	if st.LastReconcile != nil {
		rows = append(rows, []string{"last reconcile", st.LastReconcile.Format(time.RFC3339) + errNote(st.LastError)})
	}
	if len(st.GuardRefused) > 0 {
		rows = append(rows, []string{"VXLAN guard", "refused lately: " + strings.Join(st.GuardRefused, ", ")})
	}
	if st.ConfigPending != "" {
		rows = append(rows, []string{"config", "pending restart: " + st.ConfigPending})
	}
	rows = append(rows, []string{"ready", yesNo(st.Ready)})
	for _, c := range st.Conditions {
		v := "ok"
		if !c.OK {
			v = "FAIL: " + c.Reason
		}
		rows = append(rows, []string{"  " + c.Name, v})
	}
	return printer.Output{Rows: rows, JSON: st}
}

func deviceLine(name string, mtu int, mac string) string {
	return orDash(name) + " mtu " + strconv.Itoa(mtu) + " mac " + orDash(mac)
}

func leaseNote(st daemon.Status) string {
	switch {
	case st.Reserved:
		return " (reserved)"
	case st.LeaseExpires != nil:
		left := time.Until(*st.LeaseExpires).Round(time.Second)
		if left < 0 {
			// The daemon's last renewal did not reach past now: the lease
			// may be gone from etcd.
			return " (expired " + (-left).String() + " ago unless renewed since: check `overlayd lease get` and the daemon's etcd connection)"
		}
		return " (expires in " + left.String() + " unless renewed)"
	}
	return ""
}

// ipv4OnlyNote says how many peers are programmed in their IPv4 half only
// (their lease key predates a change of EnableIPv6), if any.
func ipv4OnlyNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d IPv4 only until %s restarted: `overlayd lease list` shows %s as ipv4-only)", n, plural(n, "its host has", "their hosts have"), plural(n, "its lease", "their leases"))
}

func errNote(e string) string {
	if e == "" {
		return ""
	}
	return " (failed: " + e + ")"
}
