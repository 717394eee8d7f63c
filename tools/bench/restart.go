package main

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// Probes as in the e2e tests: 20 a second, lost if the echo is not back
// within 900 ms (UDP has no retransmission: any packet dropped is a lost
// probe).
const (
	probeInterval = 50 * time.Millisecond
	probeTimeout  = 900 * time.Millisecond
)

// restartPeers is how many synthetic peers the restarting host also holds,
// so that a restart adopts a real table rather than one entry.
const restartPeers = 1000

// benchRestart counts UDP probes lost between pods on two hosts while the
// sending host's overlayd is restarted, with SIGTERM and with SIGKILL.
func (b *bench) benchRestart(ctx context.Context) error {
	t, err := b.newTwoHosts(ctx, "rst", benchNetwork, restartPeers)
	if err != nil {
		return err
	}
	defer t.l.Close()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		var lost, sent, ready []float64
		for run := range b.cfg.Runs {
			s, err := lab.StartStream(t.p1.NS, netip.AddrPortFrom(t.p2.IP, lab.ProbePort), probeInterval, probeTimeout)
			if err != nil {
				return err
			}
			time.Sleep(time.Second)
			start := time.Now()
			err = t.h1.Restart(sig)
			if err == nil {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err = t.h1.WaitReady(rctx)
				cancel()
			}
			took := time.Since(start)
			time.Sleep(2 * time.Second)
			st := s.Stop()
			if err != nil {
				return fmt.Errorf("restart with %s: %w", sig, err)
			}
			b.logf("restart %s run %d: ready again after %s; probes: %s", sig, run+1, took.Round(time.Millisecond), st)
			lost = append(lost, float64(len(st.Lost)))
			sent = append(sent, float64(st.Sent))
			ready = append(ready, secs(took))
		}
		p := map[string]any{"signal": map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig], "peers": restartPeers + 1}
		b.add(result{Measure: "restart", Metric: "lost_probes", Unit: "probes", Params: p}, lost)
		b.add(result{Measure: "restart", Metric: "probes_sent", Unit: "probes", Params: p}, sent)
		b.add(result{Measure: "restart", Metric: "signal_to_ready", Unit: "s", Params: p}, ready)
	}
	return nil
}
