package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// A network that holds the hosts' own underlay addresses, or can never be
// a cluster network, never leaves a host green (issue 28 item 1: every
// host leased a subnet, skipped its own lease and answered /readyz 200).
// config put refuses it; stored anyway (an older version, etcdctl), a
// running host goes not ready and a starting host refuses to start (exit
// 1, one line naming its address and the network, before it claims a
// lease) or waits, not ready.
func TestANetworkHoldingTheHostsNeverGoesGreen(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	ctx := ctxT(t, time.Minute)

	file := t.TempDir() + "/net.json"
	if err := os.WriteFile(file, []byte(`{"Network":"198.18.0.0/16"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := l.CLI(ctx, "config", "put", "-f", file, "--force")
	if err == nil || !strings.Contains(err.Error(), "refusing to store the config: Network 198.18.0.0/16 holds 2 underlay addresses of hosts") {
		t.Fatalf("config put of a network holding both hosts: %v", err)
	}

	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, tc := range []struct {
		config  string
		running string // in the running host's /readyz
		start   string // what a starting host says
		exits   bool   // it exits 1 (else it waits, not ready)
	}{
		{`{"Network":"198.18.0.0/16","Backend":{"Type":"vxlan"}}`,
			"config: network config changed while running: /coreos.com/network/config: Network 198.18.0.0/16 holds this host's public address " + h2.IP.String(),
			"Error: this host's public address " + h1.IP.String() + " (interface eth0) is inside Network 198.18.0.0/16 of /coreos.com/network/config", true},
		{`{"Network":"0.0.0.0/0","Backend":{"Type":"vxlan"}}`,
			"Network 0.0.0.0/0 is the default route",
			"waiting to read the network config: /coreos.com/network/config: invalid network config: Network 0.0.0.0/0 is the default route", false},
	} {
		// h1 starts afresh (a new host, or one torn down): with a lease
		// of the old network it would refuse to start as stranded.
		if err := h1.Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if out, err := h1.Teardown(ctx); err != nil {
			t.Fatalf("teardown of h1: %v\n%s", err, out)
		}
		if _, err := cli.Put(ctx, "/coreos.com/network/config", tc.config); err != nil {
			t.Fatal(err)
		}
		labtest.Eventually(t, settle, "h2 to go not ready under "+tc.config, func() error {
			return notReadyWith(ctx, h2, tc.running)
		})
		if err := h1.Start(); err != nil {
			t.Fatal(err)
		}
		if tc.exits {
			exited, how := h1.Exited()
			select {
			case <-exited:
			case <-time.After(testenv.Deadline(30 * time.Second)):
				t.Fatalf("h1 did not refuse to start under %s", tc.config)
			}
			var exit *exec.ExitError
			if err := how(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Errorf("h1 ended with %v, want exit 1", err)
			}
			log, err := os.ReadFile(h1.LogFile)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(log), tc.start); n != 1 {
				t.Errorf("h1's log has %d lines %q, want 1:\n%s", n, tc.start, log)
			}
			leases, err := l.Leases(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(leases.Leases) != 1 {
				t.Errorf("leases after h1's refused start: %+v, want h2's only", leases.Leases)
			}
		} else {
			labtest.Eventually(t, settle+maxConfigRetry, "h1 to wait, not ready, under "+tc.config, func() error {
				return notReadyWith(ctx, h1, tc.start)
			})
		}
		// Never green meanwhile.
		for _, n := range []*lab.Node{h1, h2} {
			if ready, _, err := n.Readyz(ctx); err == nil && ready {
				t.Errorf("%s is ready under %s", n.Name, tc.config)
			}
		}
	}
	// The right config back: both hosts green again.
	if err := h1.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/coreos.com/network/config", lab.DefaultNetworkConfig); err != nil {
		t.Fatal(err)
	}
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h1)
	labtest.WaitReady(t, h2)
}

// maxConfigRetry bounds how long a starting host waits before it reads the
// config again (its retry pauses grow up to 16 s).
var maxConfigRetry = testenv.Deadline(25 * time.Second)

// notReadyWith says why n is not (yet) not ready with want in /readyz.
func notReadyWith(ctx context.Context, n *lab.Node, want string) error {
	ready, body, err := n.Readyz(ctx)
	switch {
	case err != nil:
		return err
	case ready || !strings.Contains(body, want):
		return errors.New(n.Name + " /readyz: " + body + " (want not ready with " + want + ")")
	}
	return nil
}
