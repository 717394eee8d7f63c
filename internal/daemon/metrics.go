package daemon

import (
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the daemon's Prometheus metrics, on a registry of its own (no
// package globals, so tests can run several daemons in one process).
type metrics struct {
	reg             *prometheus.Registry
	leasesSeen      prometheus.Gauge
	leasesRejected  prometheus.Gauge
	leasesOrphaned  prometheus.Gauge
	leasesReserved  prometheus.Gauge
	peersIPv4Only   prometheus.Gauge
	rejectionsTotal prometheus.Counter
	watchRestarts   prometheus.Counter
	eventLatency    prometheus.Histogram
	// The probes of the peers (peerhealth), by family and outcome, and
	// the round trips of the answered ones.
	probes   *prometheus.CounterVec
	probeRTT *prometheus.HistogramVec

	// pending maps a peer subnet to when its latest lease event arrived,
	// until the backend reports it programmed; listed holds the arrivals
	// of the start-up listing the same way, more compactly. A later event
	// of a listed peer supersedes its listed arrival.
	mu      sync.Mutex
	pending map[netip.Prefix]time.Time
	listed  listedArrivals
}

func newMetrics(p *probe) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		leasesSeen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "overlay_leases",
			Help: "Leases in etcd as last seen, this host's included."}),
		leasesRejected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "overlay_leases_invalid",
			Help: "Lease keys currently skipped because they are invalid (reservations and orphaned leases are counted apart)."}),
		leasesOrphaned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "overlay_leases_orphaned",
			Help: "Leases outside the network config (left by a change of the config), not programmed."}),
		leasesReserved: prometheus.NewGauge(prometheus.GaugeOpts{Name: "overlay_leases_reserved",
			Help: "Reservations no host has claimed yet."}),
		peersIPv4Only: prometheus.NewGauge(prometheus.GaugeOpts{Name: "overlay_peers_ipv4_only",
			Help: "Peers programmed in their IPv4 half only: their lease key predates a change of EnableIPv6 (0 once every host has restarted)."}),
		rejectionsTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "overlay_leases_invalid_total",
			Help: "Invalid lease values seen: each invalid value a key takes, once (rewriting the same value is no change)."}),
		watchRestarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "overlay_watch_restarts_total",
			Help: "Times the etcd lease watch was re-established (compaction, broken stream, periodic re-list failure)."}),
		eventLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "overlay_event_to_programmed_seconds",
			Help:    "Time from a lease event reaching the daemon to the peer's kernel entries being in place.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5}}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "overlay_peer_probes_total",
			Help: "Probes of peers through the overlay (ICMP echo to each peer's VTEP address), by family and result (answered, lost)."}, []string{"family", "result"}),
		probeRTT: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "overlay_peer_probe_rtt_seconds",
			Help:    "Round-trip time of the answered probes of peers through the overlay.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}, []string{"family"}),
		pending: map[netip.Prefix]time.Time{},
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		// Present from the start, so a rate() over them has a base.
		m.probes.WithLabelValues(fam, "answered")
		m.probes.WithLabelValues(fam, "lost")
		m.probeRTT.WithLabelValues(fam)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.leasesSeen, m.leasesRejected, m.leasesOrphaned, m.leasesReserved, m.peersIPv4Only, m.rejectionsTotal, m.watchRestarts, m.eventLatency,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "overlay_lease_expiry_seconds",
			Help: "Seconds until this host's lease expires unless renewed; +Inf for a reservation, 0 before a lease is held."},
			func() float64 {
				p.mu.Lock()
				mgr := p.held
				p.mu.Unlock()
				switch {
				case mgr == nil:
					return 0
				case mgr.Lease().Reserved:
					return math.Inf(1)
				}
				return max(0, time.Until(mgr.Expires()).Seconds())
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "overlay_ready", Help: "1 if /readyz reports ready."},
			func() float64 { return b2f(p.status(time.Now()).Ready) }),
	)
	m.reg.MustRegister(dataPlaneCollectors(p)...)
	m.reg.MustRegister(m.probes, m.probeRTT)
	m.reg.MustRegister(peerHealthCollectors(p)...)
	m.reg.MustRegister(guardCollector{p: p, dropped: prometheus.NewDesc("overlay_vxlan_guard_dropped_packets_total",
		"UDP datagrams to the VXLAN port dropped by the VXLAN guard because their source holds no valid lease (read from the guard's nftables counter).",
		[]string{"family"}, nil),
		repairs: prometheus.NewDesc("overlay_vxlan_guard_repairs_total",
			"Objects (sets, chain with its rules) and admitted addresses of the VXLAN guard's nftables table that a resync put back after something other than overlayd changed them.",
			[]string{"family"}, nil)})
	return m
}

// dataPlaneCollectors are the metrics of the data planes' combined status
// (both families' on a dual-stack host).
func dataPlaneCollectors(p *probe) []prometheus.Collector {
	status := func(f func(backend.Status) float64) func() float64 {
		return func() float64 {
			p.mu.Lock()
			planes := p.planes
			p.mu.Unlock()
			if len(planes) == 0 {
				return 0
			}
			sts := make([]backend.Status, len(planes))
			for i, be := range planes {
				sts[i] = be.Status()
			}
			return f(combined(sts))
		}
	}
	gauge := func(name, help string, f func(backend.Status) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, status(f))
	}
	counter := func(name, help string, f func(backend.Status) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, status(f))
	}
	return []prometheus.Collector{
		gauge("overlay_peers", "Peers in the desired set (valid leases of other hosts).",
			func(s backend.Status) float64 { return float64(s.Peers) }),
		gauge("overlay_peers_programmed", "Peers whose route, neighbour and FDB entry are all in the kernel.",
			func(s backend.Status) float64 { return float64(s.PeersProgrammed) }),
		gauge("overlay_device_present", "1 if the VXLAN device exists and matches.",
			func(s backend.Status) float64 { return b2f(s.DevicePresent) }),
		gauge("overlay_reconcile_last_duration_seconds", "Duration of the last reconcile pass.",
			func(s backend.Status) float64 { return s.PassTime.Seconds() }),
		gauge("overlay_reconcile_in_sync", "1 if the last reconcile pass succeeded and left nothing pending.",
			func(s backend.Status) float64 { return b2f(s.InSync) }),
		counter("overlay_reconcile_passes_total", "Reconcile passes run.",
			func(s backend.Status) float64 { return float64(s.Passes) }),
		counter("overlay_reconcile_errors_total", "Reconcile passes that failed.",
			func(s backend.Status) float64 { return float64(s.Errors) }),
		counter("overlay_netlink_writes_total", "Kernel writes issued by the reconciler.",
			func(s backend.Status) float64 { return float64(s.Writes) }),
		counter("overlay_drift_repairs_total", "Kernel entries rewritten although the desired state had not changed.",
			func(s backend.Status) float64 { return float64(s.DriftRepairs) }),
		counter("overlay_device_recreations_total", "Times the VXLAN device was deleted and created again.",
			func(s backend.Status) float64 { return float64(s.DeviceRecreations) }),
	}
}

// guardCollector reports the VXLAN guards' drop counters, read from the
// kernel at each scrape, one series per family ("ipv4", "ipv6"); none
// with --vxlan-guard=false. A guard whose counter cannot be read is left
// out of that scrape (a gap, not a false zero).
type guardCollector struct {
	p                *probe
	dropped, repairs *prometheus.Desc
}

func (c guardCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.dropped; ch <- c.repairs }

func (c guardCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.mu.Lock()
	guards := c.p.guards
	c.p.mu.Unlock()
	for _, g := range guards {
		fam := "ipv4"
		if g.Family() == backend.IPv6 {
			fam = "ipv6"
		}
		ch <- prometheus.MustNewConstMetric(c.repairs, prometheus.CounterValue, float64(g.Repairs()), fam)
		n, err := g.Dropped()
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), fam)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// listingArrived records that the peers of the start-up listing, keys,
// arrived at at (keys is taken over).
func (m *metrics) listingArrived(keys []arrivalKey, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listed = newListedArrivals(keys, at)
}

// eventArrived records when a lease event for subnet reached the daemon.
func (m *metrics) eventArrived(subnet netip.Prefix, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listed.take(subnet)
	m.pending[subnet] = at
}

// eventGone forgets a pending event whose peer will not be programmed.
func (m *metrics) eventGone(subnet netip.Prefix) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forget(subnet)
	m.listed.take(subnet)
}

// forget deletes subnet's pending event; m.mu is held. Go maps never give
// back the buckets they grew, so once nothing is pending the map is
// replaced: a cold start's burst of thousands of events does not stay
// resident for the daemon's lifetime.
func (m *metrics) forget(subnet netip.Prefix) {
	delete(m.pending, subnet)
	if len(m.pending) == 0 {
		m.pending = map[netip.Prefix]time.Time{}
	}
}

// programmed is the backend's OnPeerProgrammed hook.
func (m *metrics) programmed(peer backend.Peer, at time.Time) {
	m.mu.Lock()
	arrived, ok := m.pending[peer.Subnet]
	if ok {
		m.forget(peer.Subnet)
		m.listed.take(peer.Subnet)
	} else {
		arrived, ok = m.listed.take(peer.Subnet)
	}
	m.mu.Unlock()
	if ok {
		m.eventLatency.Observe(at.Sub(arrived).Seconds())
	}
}

// peerHealthCollectors are the counts of peers by what their probes
// found, per family: no per-peer label, so a cluster of 10,000 hosts
// costs each host four series (every peer is in /status?peers=all).
func peerHealthCollectors(p *probe) []prometheus.Collector {
	return []prometheus.Collector{peerHealthCollector{p: p,
		reachable: prometheus.NewDesc("overlay_peers_reachable",
			"Peers whose last probe through the overlay was answered.", []string{"family"}, nil),
		unreachable: prometheus.NewDesc("overlay_peers_unreachable",
			"Peers whose last probes through the overlay (3 in a row) were lost.", []string{"family"}, nil)}}
}

// peerHealthCollector reports the prober's counts, asked once a scrape
// (the prober's lock is the probing's); zero for both families with
// --peer-probe=false, as before the prober exists.
type peerHealthCollector struct {
	p                      *probe
	reachable, unreachable *prometheus.Desc
}

func (c peerHealthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.reachable
	ch <- c.unreachable
}

func (c peerHealthCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.mu.Lock()
	health := c.p.health
	c.p.mu.Unlock()
	var counts [2]peerhealth.FamilyCounts
	if health != nil {
		counts[0], counts[1] = health.Counts()
	}
	for i, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		ch <- prometheus.MustNewConstMetric(c.reachable, prometheus.GaugeValue, float64(counts[i].Reachable), familyLabel(fam))
		ch <- prometheus.MustNewConstMetric(c.unreachable, prometheus.GaugeValue, float64(counts[i].Unreachable), familyLabel(fam))
	}
}

// probed counts one probe's outcome (peerhealth.Config.OnResult).
func (m *metrics) probed(fam backend.Family, answered bool, rtt time.Duration) {
	if !answered {
		m.probes.WithLabelValues(familyLabel(fam), "lost").Inc()
		return
	}
	m.probes.WithLabelValues(familyLabel(fam), "answered").Inc()
	m.probeRTT.WithLabelValues(familyLabel(fam)).Observe(rtt.Seconds())
}

// familyLabel is fam as the metrics' family label says it ("ipv4",
// "ipv6"), as the guard's drop counter does.
func familyLabel(fam backend.Family) string {
	if fam == backend.IPv6 {
		return "ipv6"
	}
	return "ipv4"
}
