package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// refusals counts log records of the simulated hosts that say etcd
// refused a request for lack of resources (ResourceExhausted, too many
// requests); warnings counts every warning, and kinds each kind of warning
// (its message and the start of its reason or error), which says what the
// hosts went through in a scenario.
type countingHandler struct {
	warnings, refusals *atomic.Int64
	kinds              *warningKinds
}

// addrs matches the addresses, subnets and numbers that make each host's
// warnings differ.
var addrs = regexp.MustCompile(`[0-9a-f]*[0-9][0-9a-f.:/-]*`)

type warningKinds struct {
	mu sync.Mutex
	n  map[string]int
}

func (k *warningKinds) add(kind string) {
	k.mu.Lock()
	k.n[kind]++
	k.mu.Unlock()
}

func (k *warningKinds) snapshot() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.n)
}

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.warnings.Add(1)
	text := r.Message
	kind := r.Message
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.Value.String()
		if a.Key == "reason" || a.Key == "err" {
			v := addrs.ReplaceAllString(a.Value.String(), "X")
			kind += ": " + v[:min(len(v), 100)]
		}
		return true
	})
	h.kinds.add(kind)
	if strings.Contains(text, "too many") || strings.Contains(text, "ResourceExhausted") || strings.Contains(text, "resource exhausted") {
		h.refusals.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// worker runs hosts [from, to) and answers the coordinator's commands, one
// per line on stdin, with one JSON line each on stdout.
type worker struct {
	hosts []*simHost
	cnt   *rpcCounter
	warn  atomic.Int64
	refus atomic.Int64
	kinds warningKinds
	// proxies stand between some hosts and the members (see runWorker).
	proxies []*lab.Proxy
	out     *json.Encoder
}

// runWorker runs hosts [from, to). The hosts whose index ends in a digit
// below proxied×10 reach the members through proxies of their own (sockets
// in dir), which the "partition" command turns into blackholes.
func runWorker(source string, eps []string, from, to int, proxied float64, dir string, gogc int) error {
	// Each host holds every lease: the simulator's memory grows as N², so
	// by default garbage is collected sooner than Go's default (-worker-gogc).
	debug.SetGCPercent(gogc)
	w := &worker{cnt: &rpcCounter{n: map[string]*atomic.Int64{}}, out: json.NewEncoder(os.Stdout), kinds: warningKinds{n: map[string]int{}}}
	log := slog.New(countingHandler{&w.warn, &w.refus, &w.kinds})
	cut := int(math.Round(proxied * 10))
	var viaProxies []string
	if cut > 0 {
		for i, ep := range eps {
			p, err := lab.NewProxy(filepath.Join(dir, fmt.Sprintf("w%d-m%d.sock", from, i)), ep)
			if err != nil {
				return err
			}
			defer p.Close()
			w.proxies = append(w.proxies, p)
			viaProxies = append(viaProxies, p.Endpoint())
		}
	}
	for i := from; i < to; i++ {
		h := &simHost{idx: i, source: etcdSource, eps: eps, cnt: w.cnt, log: log, rec: &recorder{seen: map[netip.Prefix]int64{}},
			journal: filepath.Join(dir, fmt.Sprintf("host-%05d.leases", i))}
		if i%10 < cut {
			h.eps = viaProxies
		}
		if source == "kube" {
			h.source = kubeSource(eps[0], dir)
		}
		w.hosts = append(w.hosts, h)
	}
	t0 := time.Now()
	w.parallel(w.hosts, 64, func(h *simHost) { w.must(h.start(context.Background())) })
	var steps []float64
	for i := range stepTime {
		steps = append(steps, time.Duration(stepTime[i].Load()).Seconds()/float64(len(w.hosts)))
	}
	w.reply(map[string]any{"started": len(w.hosts), "secs": time.Since(t0).Seconds(), "step_secs": steps})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "seen":
			w.seen(netip.MustParsePrefix(f[1]), atof(f[2]))
		case "stats":
			w.stats()
		case "restart":
			w.restart(atof(f[1]), atof(f[2]))
		case "partition", "heal":
			mode := map[string]lab.ProxyMode{"partition": lab.ProxyBlackhole, "heal": lab.ProxyUp}[f[0]]
			for _, p := range w.proxies {
				p.Set(mode)
			}
			w.reply(map[string]any{"proxies": len(w.proxies)})
		case "quit":
			w.parallel(w.hosts, 256, (*simHost).stop)
			w.reply(map[string]any{"quit": true})
			return nil
		}
	}
	return sc.Err()
}

func atof(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }

func (w *worker) must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func (w *worker) reply(v any) { w.must(w.out.Encode(v)) }

func (w *worker) parallel(hs []*simHost, n int, f func(*simHost)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, h := range hs {
		sem <- struct{}{}
		wg.Go(func() { defer func() { <-sem }(); f(h) })
	}
	wg.Wait()
}

// seen waits until every host has p among its peers (or timeout seconds
// pass) and reports when each host first saw it.
func (w *worker) seen(p netip.Prefix, timeout float64) {
	deadline := time.Now().Add(time.Duration(timeout * float64(time.Second)))
	var times []int64
	missing := 0
	for {
		times, missing = times[:0], 0
		for _, h := range w.hosts {
			h.rec.mu.Lock()
			_, ok := h.rec.peers[p]
			t := h.rec.seen[p]
			h.rec.mu.Unlock()
			if !ok {
				missing++
			} else {
				times = append(times, t)
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.reply(map[string]any{"seen": times, "missing": missing})
}

func (w *worker) stats() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	// relists_max is the most re-lists one host did since the last stats.
	relists, periodic, most := 0, 0, 0
	for _, h := range w.hosts {
		h.rec.mu.Lock()
		relists += h.rec.relists
		periodic += h.rec.periodic
		most = max(most, h.rec.relists-h.rec.reported)
		h.rec.reported = h.rec.relists
		h.rec.mu.Unlock()
	}
	w.reply(map[string]any{"hosts": len(w.hosts), "rpcs": w.cnt.snapshot(), "heap": ms.HeapInuse, "rss": selfRSS(),
		"relists": relists, "periodic_relists": periodic, "relists_max": most, "warnings": w.warn.Load(), "refusals": w.refus.Load(), "warning_kinds": w.kinds.snapshot()})
}

// restart restarts frac of the hosts, each at a random moment within spread
// seconds, as overlayd restarts would (same node ID, same subnet).
func (w *worker) restart(frac, spread float64) {
	var pick []*simHost
	for _, h := range w.hosts {
		if rand.Float64() < frac {
			pick = append(pick, h)
		}
	}
	t0 := time.Now()
	var finished atomic.Int64
	var wg sync.WaitGroup
	for _, h := range pick {
		wg.Go(func() {
			time.Sleep(time.Duration(rand.Float64() * spread * float64(time.Second)))
			h.stop()
			w.must(h.start(context.Background()))
			finished.Add(1)
		})
	}
	// Bounded: hosts still starting after 5 minutes are a result (they
	// go on starting; the coordinator's probes show when they are done).
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
	}
	w.reply(map[string]any{"restarted": len(pick), "started_again": finished.Load(), "secs": time.Since(t0).Seconds()})
}

func selfRSS() int64 { return procRSS(os.Getpid()) }
