package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/lab"
)

// profile runs overlayd's code in this process (daemon.Run, in a lab host
// namespace, against the lab's etcd) under pprof, so that its cold path
// and its event path can be read function by function:
//
//	cold.cpu.pprof, cold.allocs.pprof   cold start with the largest K
//	cold-dual.cpu.pprof, ...            dual-stack cold start with the largest K of -dual (if any)
//	event.cpu.pprof, event.allocs.pprof single lease events at the first event base
//
// The daemon shares the process with the observer and etcd; the profiles
// are filtered to its code when read (go tool pprof -focus).
func (b *bench) profile(ctx context.Context) error {
	if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
		return err
	}
	if err := b.profileCold(ctx, slicesMax(b.cfg.Ks), ipv4Only); err != nil {
		return fmt.Errorf("cold path: %w", err)
	}
	if len(b.cfg.DualKs) > 0 {
		if err := b.profileCold(ctx, slicesMax(b.cfg.DualKs), dualStack); err != nil {
			return fmt.Errorf("dual-stack cold path: %w", err)
		}
	}
	base := 1000
	if len(b.cfg.EventBase) > 0 {
		base = b.cfg.EventBase[0]
	}
	if err := b.profileEvents(ctx, base); err != nil {
		return fmt.Errorf("event path: %w", err)
	}
	b.logf("profiles written to %s; read them with e.g.\n  go tool pprof -top -focus 'overlay/(backend|subnet|internal/daemon)|netlink' %s",
		b.cfg.ProfileDir, filepath.Join(b.cfg.ProfileDir, "cold.cpu.pprof"))
	return nil
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// inProcessDaemon runs daemon.Run for a lab host until stop is called.
type inProcessDaemon struct {
	cancel context.CancelFunc
	done   chan error
}

func (d *inProcessDaemon) stop() error {
	d.cancel()
	return <-d.done
}

func startInProcess(ctx context.Context, endpoint, name, dir string, h *lab.Host) (*inProcessDaemon, error) {
	logf, err := os.Create(filepath.Join(dir, name+"-inprocess.log"))
	if err != nil {
		return nil, err
	}
	cfg := daemon.Config{
		Etcd:         etcdclient.Config{Endpoints: []string{endpoint}},
		NodeName:     name,
		Iface:        "eth0",
		PublicIP:     h.IP,
		SubnetFile:   filepath.Join(dir, name+"-subnet.env"),
		NetNS:        h.NS,
		IPMasq:       true,
		KernelResync: 30 * time.Second,
		Logger:       slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &inProcessDaemon{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := daemon.Run(ctx, cfg)
		logf.Close()
		d.done <- err
	}()
	return d, nil
}

func (b *bench) profileCold(ctx context.Context, k int, s stack) error {
	name := "cold"
	if s == dualStack {
		name = "cold-dual"
	}
	sh, err := b.seedHost(ctx, "p"+name, "pc1", k, s)
	if err != nil {
		return err
	}
	defer sh.Close()
	l, n, w, peers := sh.lab, sh.node, sh.watch, sh.peers
	done := w.expect(peers, true)
	runtime.GC()
	stopProf, err := startProfile(b.cfg.ProfileDir, name)
	if err != nil {
		return err
	}
	start := time.Now()
	d, err := startInProcess(ctx, l.Endpoint(), "pc1", l.Dir, n.Host)
	if err != nil {
		return err
	}
	at, werr := w.wait(done, b.cfg.ColdTimeout)
	if err := stopProf(); err != nil {
		return err
	}
	if werr != nil {
		_ = d.stop()
		return werr
	}
	b.logf("in-process %s cold start of %d peers: %s (profiles %s.*.pprof)", s, k, at.Sub(start).Round(time.Millisecond), name)
	if err := d.stop(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (b *bench) profileEvents(ctx context.Context, base int) error {
	sh, err := b.seedHost(ctx, "pev", "pe1", base, ipv4Only)
	if err != nil {
		return err
	}
	defer sh.Close()
	l, cli, n, w, basePeers := sh.lab, sh.cli, sh.node, sh.watch, sh.peers
	ready := w.expect(basePeers, true)
	d, err := startInProcess(ctx, l.Endpoint(), "pe1", l.Dir, n.Host)
	if err != nil {
		return err
	}
	defer d.stop()
	if _, err := w.wait(ready, b.cfg.ColdTimeout); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	runtime.GC()
	stopProf, err := startProfile(b.cfg.ProfileDir, "event")
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range b.cfg.Events {
		peer := synthPeers(base+201+i, base+202+i)
		for _, add := range []bool{true, false} {
			done := w.expect(peer, add)
			if add {
				_, err = cli.Put(ctx, leaseKey(peer[0].Subnet), leaseValue(peer[0]))
			} else {
				_, err = cli.Delete(ctx, leaseKey(peer[0].Subnet))
			}
			if err != nil {
				_ = stopProf()
				return err
			}
			if _, err := w.wait(done, eventTimeout); err != nil {
				_ = stopProf()
				return err
			}
			time.Sleep(eventGap)
		}
	}
	if err := stopProf(); err != nil {
		return err
	}
	b.logf("in-process: %d single events (add+delete) at base %d in %s (profiles event.*.pprof)", b.cfg.Events, base, time.Since(start).Round(time.Millisecond))
	return nil
}

// startProfile starts a CPU profile; the returned function stops it and
// writes the allocation profiles at the start and the end of the span (read
// the difference with go tool pprof -diff_base NAME.allocs.base.pprof
// NAME.allocs.pprof).
func startProfile(dir, name string) (func() error, error) {
	runtime.MemProfileRate = 64 << 10
	if err := writeAllocs(filepath.Join(dir, name+".allocs.base.pprof")); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name+".cpu.pprof"))
	if err != nil {
		return nil, err
	}
	// 1 kHz rather than pprof's 100 Hz: a cold start lasts a few hundred
	// milliseconds. (Setting the rate first is the documented way; pprof
	// then warns that it cannot change it, and keeps it.)
	runtime.SetCPUProfileRate(1000)
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return err
		}
		return writeAllocs(filepath.Join(dir, name+".allocs.pprof"))
	}, nil
}

func writeAllocs(path string) error {
	runtime.GC() // the profile reflects the last completed GC
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
