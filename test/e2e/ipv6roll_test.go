package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
)

// Turning IPv6 on and off again as configuration.md says — `overlayd
// config put` (no --force), then restart overlayd host by host — loses no
// IPv4 probe between pods of the two hosts, streamed at 20 a second each
// way through both rolls: between restarts each host programs the IPv4
// half of the other's key (shown as ipv4-only in `lease list`), and the
// host not yet restarted stays ready with the change pending. Each host
// keeps its IPv4 subnet; after the roll on, new pods reach each other
// over IPv6; after the roll off, no host has an IPv6 device left.
func TestIPv6RollOnAndOff(t *testing.T) {
	t.Parallel()
	const (
		v4Config   = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
		dualConfig = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`
	)
	l := labtest.New(t, lab.Config{NetworkConfig: v4Config})
	nodes := labtest.Hosts(t, l, 2)
	waitRoutes(t, nodes, settle)
	pods := labtest.Pods(t, nodes, 1)
	a, b := pods[0], pods[1]
	var streams []*lab.Stream
	for _, dir := range [][2]*lab.Pod{{a, b}, {b, a}} {
		s, err := lab.StartStream(dir[0].NS, netip.AddrPortFrom(dir[1].IP, lab.ProbePort), streamInterval, streamTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		warmUp(t, s, 5)
		streams = append(streams, s)
	}
	before := map[*lab.Node]string{}
	for _, n := range nodes {
		before[n] = lease(t, n).String()
	}

	roll := func(config string, v6 bool) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := l.CLI(ctxT(t, 30*time.Second), "config", "put", "-f", file); err != nil {
			t.Fatalf("config put without --force: %v", err)
		}
		for i, n := range nodes {
			if i == 0 {
				// Not restarted yet: ready, the change pending.
				labtest.Eventually(t, settle, n.Name+" to report the change pending", func() error {
					st, err := n.Status(ctxT(t, 10*time.Second))
					if err != nil {
						return err
					}
					if !st.Ready || !strings.Contains(st.ConfigPending, "EnableIPv6") {
						return fmt.Errorf("%s: ready %v, pending %q", n.Name, st.Ready, st.ConfigPending)
					}
					return nil
				})
			}
			if err := n.Restart(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			labtest.WaitReady(t, n)
			if got := lease(t, n).String(); got != before[n] {
				t.Fatalf("%s's IPv4 subnet changed across the roll: %s -> %s", n.Name, before[n], got)
			}
			if got, err := n.IPv6Lease(); err != nil || got.IsValid() != v6 {
				t.Fatalf("%s's IPv6 subnet after its restart: %v (%v), want one: %v", n.Name, got, err, v6)
			}
			waitRoutes(t, nodes, settle)
			if i == 0 {
				// Half the hosts restarted: each programs the other's IPv4 half.
				other := nodes[1]
				ll, err := l.Leases(ctxT(t, 30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if r, ok := ll.ByNode(other.Name); !ok || r.State != "ipv4-only" {
					t.Errorf("mid-roll, %s's lease: %+v, want it listed as ipv4-only", other.Name, r)
				}
				for _, m := range nodes {
					st, err := m.Status(ctxT(t, 10*time.Second))
					if err != nil || !st.Ready || st.PeersIPv4Only != 1 {
						t.Errorf("mid-roll, %s's status: %+v (%v), want ready with 1 peer IPv4 only", m.Name, st, err)
					}
				}
			}
		}
	}

	roll(dualConfig, true)
	waitRoutes6(t, nodes, settle)
	// Pods created now get IPv6 addresses, and reach each other over IPv6.
	c, d := labtest.AddPod(t, nodes[0], "p6"), labtest.AddPod(t, nodes[1], "p6")
	labtest.Eventually(t, settle, "new pods to reach each other over IPv6", func() error {
		return errors.Join(reach6(c, d), reach6(d, c))
	})
	if err := errors.Join(c.Delete(ctxT(t, 30*time.Second)), d.Delete(ctxT(t, 30*time.Second))); err != nil {
		t.Fatal(err)
	}

	roll(v4Config, false)
	for _, n := range nodes {
		h, err := netlink.NewHandleAt(n.NS)
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.LinkByName("overlay-v6.1")
		h.Close()
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			t.Errorf("%s after IPv6 was turned off: overlay-v6.1: %v, want it removed", n.Name, err)
		}
		if rs, err := n.IPv6Routes(); err != nil || len(rs) != 0 {
			t.Errorf("%s after IPv6 was turned off: IPv6 overlay routes %v (%v), want none", n.Name, rs, err)
		}
		if log, err := os.ReadFile(n.LogFile); err != nil || !strings.Contains(string(log), "removed the IPv6 device of an earlier run") {
			t.Errorf("%s's log does not say it removed overlay-v6.1 (%v)", n.Name, err)
		}
	}
	// 2.5 s more of traffic after the last restart.
	seenAt := streams[0].Stats().Sent
	labtest.Eventually(t, 50*streamInterval+settle, "2.5 s of traffic after the roll", func() error {
		if sent := streams[0].Stats().Sent; sent < seenAt+50 {
			return fmt.Errorf("%d probes since the roll", sent-seenAt)
		}
		return nil
	})
	for i, s := range streams {
		from, to := pods[i], pods[1-i]
		checkStream(t, fmt.Sprintf("%s -> %s through a roll of IPv6 on and off", from, to), s.Stop())
	}
}
