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
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/spf13/cobra"
)

func newStatusCommand(g *GlobalFlags) *cobra.Command {
	var (
		addr  string
		peers bool
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show this host's lease, device, peers and readiness, from the local overlayd",
		Long: `Ask the overlayd running on this host (its --health-addr) for its state: the
lease, public IP, VXLAN device (in a dual-stack network also the IPv6 subnet,
public IPv6 and IPv6 device), peers programmed versus expected, and each
readiness condition with the reason it fails, and what the probes of the
peers through the overlay found. With --peers, every peer's health instead:
reachable or not and since when, the last and smoothed round trip, the
probes lost in a row, and the probes sent, answered and lost. Exits 1 if the
daemon is not ready or cannot be reached (an unreachable peer does not make
it unready).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format := g.out
			ctx, cancel := context.WithTimeout(cmd.Context(), g.DialTimeout)
			defer cancel()
			st, err := fetchStatus(ctx, addr, peers)
			if err != nil {
				return err
			}
			out := statusOutput(st)
			if peers {
				if st.PeerHealth == nil {
					return fmt.Errorf("overlayd at %s does not probe its peers: it runs with --peer-probe=false", addr)
				}
				out = peersOutput(*st.PeerHealth, time.Now())
			}
			if err := printer.Write(cmd.OutOrStdout(), format, out); err != nil {
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
	c.Flags().BoolVar(&peers, "peers", false, "show every peer's health (what the probes through the overlay found) instead")
	checkFlag(c.Flags(), "peers", boolean)
	fromEnv(c.Flags(), "health-addr") // the local daemon's, as run reads it
	return c
}

// fetchStatus asks the daemon at addr for its status, with every peer's
// health if peers, else without (with thousands of peers that is
// megabytes).
func fetchStatus(ctx context.Context, addr string, peers bool) (daemon.Status, error) {
	var st daemon.Status
	url, limit := "http://"+addr+"/status", int64(1<<20)
	if peers {
		url += "?peers=all"
		limit = 1 << 30 // about 300 bytes a peer
	}
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
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(&st); err != nil {
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
	if st.PeerHealth != nil {
		// Absent with --peer-probe=false.
		rows = append(rows[:len(rows)-1], []string{"peer health", peerHealthLine(st.PeerHealth)}, rows[len(rows)-1])
	}
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

// peerHealthLine sums up what the probes of the peers found: the peers
// in each state, and the worst one if any is unreachable.
func peerHealthLine(ph *daemon.PeerHealth) string {
	switch {
	case !ph.Probing && len(ph.Problems) > 0:
		return "not probed: " + strings.Join(ph.Problems, "; ")
	}
	c := ph.IPv4
	c.Reachable += ph.IPv6.Reachable
	c.Unreachable += ph.IPv6.Unreachable
	c.Unknown += ph.IPv6.Unknown
	line := fmt.Sprintf("%d reachable, %d unreachable, %d not probed yet", c.Reachable, c.Unreachable, c.Unknown)
	if len(ph.Worst) > 0 && ph.Worst[0].State == peerhealth.Unreachable {
		w := ph.Worst[0]
		line += fmt.Sprintf(" (worst: %s %s, unreachable since %s; overlayd status --peers)", w.Peer, w.Family, w.Since.Format(time.RFC3339))
	}
	if len(ph.Problems) > 0 {
		line += "; not probed: " + strings.Join(ph.Problems, "; ")
	}
	return line
}

// peersOutput is `overlayd status --peers`: a row per peer and family.
func peersOutput(ph daemon.PeerHealth, now time.Time) printer.Output {
	out := printer.Output{JSON: ph, Header: []string{"PEER", "FAMILY", "VTEP", "PUBLIC IP", "STATE", "SINCE", "LAST RTT", "SMOOTHED RTT", "LOST IN A ROW", "SENT", "ANSWERED", "LOST"}}
	for _, p := range ph.Peers {
		out.Rows = append(out.Rows, []string{p.Peer, p.Family, p.VTEP, p.PublicIP, p.State.String(), sinceCell(p.Since, now),
			rttCell(p.LastRTTMicros), rttCell(p.SmoothedRTTMicros), strconv.Itoa(p.ConsecutiveLosses),
			strconv.FormatUint(p.Sent, 10), strconv.FormatUint(p.Received, 10), strconv.FormatUint(p.Lost, 10)})
	}
	return out
}

func sinceCell(t, now time.Time) string {
	if t.IsZero() {
		return printer.None
	}
	return t.UTC().Format(time.RFC3339) + " (" + now.Sub(t).Round(time.Second).String() + " ago)"
}

func rttCell(us int64) string {
	if us == 0 {
		return printer.None
	}
	return (time.Duration(us) * time.Microsecond).String()
}
