package daemon

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"time"

	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/subnet"
)

// loop follows the cluster once start-up is done: lease events become peer
// sets for the backend, config changes become a readiness condition, and
// subnet.env is kept true. It returns nil when ctx ends, or the error that
// ends the daemon (the lease lost for good).
func (d *daemon) loop(ctx context.Context) error {
	fatal := make(chan error, 1)
	d.wg.Go(func() {
		if err := d.src.Keep(ctx); err != nil {
			fatal <- err
		}
	})
	configs := d.src.WatchConfig(ctx)
	d.wg.Go(func() { <-ctx.Done(); drain(configs) }) // as watchLeases does
	batches := d.batches
	drift := configWatch{running: d.netCfg, lease: d.lease.Subnets(), key: d.src.ConfigKey(), public: []netip.Addr{d.ul.PublicIP, d.ul.PublicIPv6}, log: d.log}
	d.st.set(func(p *probe) { p.env, p.phase = d.env, "" })
	envCheck := time.NewTicker(envCheckInterval)
	defer envCheck.Stop()
	refusedCheck := time.NewTicker(refusedCheckInterval)
	defer refusedCheck.Stop()
	d.checkRefused()
	for {
		select {
		case <-ctx.Done():
			d.log.Info("stopping; the data path stays in place (overlayd teardown removes it)")
			return nil
		case err := <-fatal:
			return err
		case b, ok := <-batches:
			if ok {
				d.onBatch(b)
			}
		case u, ok := <-configs:
			if ok {
				reason, pending := drift.update(u)
				d.st.set(func(p *probe) { p.config, p.pending = reason, pending })
			}
		case <-refusedCheck.C:
			d.checkRefused()
		case <-envCheck.C:
			// The devices' MTU follows the underlay's; pods must learn it.
			if mtu := d.podMTU(); mtu > 0 {
				d.env.set(func(e *subnet.Env) { e.MTU = mtu })
			}
			d.env.keep(d.log)
		}
	}
}

// watchLeases starts the lease watch from the start-up lease set (the
// source keeps its journal, if it has one, from there on).
func (d *daemon) watchLeases(ctx context.Context) {
	d.batches = d.src.Watch(ctx, d.snap, subnet.WatchOptions{Logger: d.log, OnRestart: func(string) { d.m.watchRestarts.Inc() }})
	// The watch ends by closing its channel once ctx is cancelled; the
	// shutdown waits for that before the source closes, so a re-list in
	// flight never runs on a closed client.
	batches := d.batches
	d.wg.Go(func() { <-ctx.Done(); drain(batches) })
}

// catchUp applies the watch's batches until the lease set is current
// (one CaughtUp), when the set Acquire returned was saved by the last run
// and the store has moved on since (Snapshot.Behind): readiness promises
// that the first pass programs the lease set as it is, not as it was when
// this host stopped. It is quick: the watch delivers only what changed
// meanwhile.
func (d *daemon) catchUp(ctx context.Context) error {
	if d.snap.Behind == "" {
		return nil
	}
	d.st.setPhase(d.snap.Behind)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b, ok := <-d.batches:
			if !ok {
				return ctx.Err()
			}
			d.onBatch(b)
			if b.CaughtUp {
				return nil
			}
		}
	}
}

// onBatch applies one batch of lease events to the peer set and hands the
// result to the backend.
func (d *daemon) onBatch(b subnet.Batch) {
	if b.Empty() {
		return // the store's revision moved on; no lease changed
	}
	before := d.peers.programmed(b)
	now := time.Now()
	rejected := d.peers.apply(b)
	for _, ev := range b.Events {
		if d.peers.isPeer(ev.Lease.ID()) && ev.Type != subnet.Removed {
			d.m.eventArrived(ev.Lease.Subnets().Primary(), now)
		} else {
			d.m.eventGone(ev.Lease.Subnets().Primary())
		}
	}
	logEvents(d.log, b, d.lease.Subnets(), before, d.peers)
	d.m.rejected(rejected, d.log)
	// A re-list, and values the source could not read (which drop the
	// peers on their subnets), are handed over in any case; otherwise the
	// peers the batch's events name tell whether the set changed.
	if b.Resync || len(b.Invalid) > 0 || len(b.Deleted) > 0 || !maps.Equal(before, d.peers.programmed(b)) {
		d.publishPeers()
		return
	}
	// No peer changed (this host's own lease, a reservation, a value
	// skipped before and after): the planes and the prober keep the set
	// they have. Handing it over again would make each validate and sort
	// every peer for nothing; at a cold start the watch delivers this
	// host's own new lease while the first pass runs.
	d.publishCounts()
}

// publishPeers hands the peer set to the backends and records its size.
func (d *daemon) publishPeers() {
	for _, fp := range d.planes {
		peers := d.peers.peers(fp.family)
		fp.plane.SetPeers(peers)
		if d.prober != nil {
			// The prober keeps the slice until it reads it (at a cold
			// start, after the first pass): the daemon must not reuse it.
			d.prober.SetPeers(fp.family, peers)
			d.peers.givenAway(fp.family)
		}
	}
	d.publishCounts()
}

// publishCounts updates the status and the metrics with the peer set's
// counts.
func (d *daemon) publishCounts() {
	valid, c, own := d.peers.size(), d.peers.counts(), d.peers.ownProblem()
	d.st.set(func(p *probe) { p.peers, p.counts, p.own = valid, c, own })
	m := d.m
	m.leasesSeen.Set(float64(valid + c.invalid + c.orphaned + c.reserved + 1)) // + our own
	m.leasesRejected.Set(float64(c.invalid))
	m.leasesOrphaned.Set(float64(c.orphaned))
	m.leasesReserved.Set(float64(c.reserved))
	m.peersIPv4Only.Set(float64(c.ipv4Only))
}

// logEvents logs what a batch did to the peer set: a peer added, changed
// or removed. A key that is not a peer before nor after (an unclaimed
// reservation, an invalid or orphaned lease, reported apart as skipped)
// is no peer event; a peer whose new value is skipped is removed. before
// is what the peer set held of the batch's keys before it was applied
// (programmed), after the set it was applied to. A key the batch names
// more than once is logged once, as it ends.
func logEvents(log *slog.Logger, b subnet.Batch, own subnet.Subnets, before map[subnet.ID]programmedPeer, after *peerSet) {
	last := make(map[subnet.ID]int, len(b.Events))
	for i, ev := range b.Events {
		last[ev.Lease.ID()] = i
	}
	for i, ev := range b.Events {
		sn := ev.Lease.Subnets()
		id := sn.ID()
		if sn == own || last[id] != i {
			continue
		}
		was, wasPeer := before[id]
		isPeer := ev.Type != subnet.Removed && after.isPeer(id)
		attrs := []any{"peer", sn.String()}
		var msg string
		switch {
		case isPeer:
			msg = "peer added"
			if wasPeer {
				msg = "peer changed"
			}
			attrs = append(attrs, "public_ip", ev.Lease.Attrs.PublicIP, "node_id", ev.Lease.Attrs.NodeID)
			if ev.Lease.Attrs.PublicIPv6 != "" {
				attrs = append(attrs, "public_ipv6", ev.Lease.Attrs.PublicIPv6)
			}
			if mac, ok := codecs.LeaseVtepMAC(ev.Lease.Attrs.BackendData, "BackendData"); ok {
				attrs = append(attrs, "vtep_mac", mac)
			}
			if mac, ok := codecs.LeaseVtepMAC(ev.Lease.Attrs.BackendV6Data, "BackendV6Data"); ok {
				attrs = append(attrs, "vtep_mac_v6", mac)
			}
			if why := after.cfg.IPv4Only(ev.Lease); why != "" {
				attrs = append(attrs, "ipv4_only", why)
			}
		case wasPeer:
			msg = "peer removed"
			for i, keys := range [2][2]string{{"public_ip", "vtep_mac"}, {"public_ipv6", "vtep_mac_v6"}} { // by famIndex
				if p := was[i]; p.PublicIP.IsValid() {
					attrs = append(attrs, keys[0], p.PublicIP.String(), keys[1], after.codec.String(p.Data))
				}
			}
		default:
			continue // never a peer: its skip (if any) is logged apart
		}
		log.Info(msg, attrs...)
	}
}

// rejected logs and counts newly skipped leases.
func (m *metrics) rejected(rs []rejection, log *slog.Logger) {
	for _, r := range rs {
		if r.Kind == orphanedLease {
			log.Warn("skipping orphaned lease", "key", r.Key, "reason", r.Err)
		} else {
			log.Warn("skipping invalid lease", "key", r.Key, "err", r.Err)
			m.rejectionsTotal.Inc()
		}
		if r.ID.Primary().IsValid() {
			m.eventGone(r.ID.Primary())
		}
	}
}

// drain discards what ch delivers until it is closed.
func drain[T any](ch <-chan T) {
	for range ch {
	}
}

// podMTU is the MTU pods must use: the smallest of the devices' (the IPv6
// device's is 20 bytes smaller over an IPv6 underlay), 0 if none is known.
func (d *daemon) podMTU() int {
	mtu := 0
	for _, fp := range d.planes {
		if fp.plane == nil {
			continue
		}
		if m := fp.plane.Status().MTU; m > 0 && (mtu == 0 || m < mtu) {
			mtu = m
		}
	}
	return mtu
}

// refusedCheckInterval is how often the daemon reads the VXLAN guards'
// refused sources.
const refusedCheckInterval = 10 * time.Second

// refusedMsg is logged once for each refused source (see refusedLog).
const refusedMsg = "the VXLAN guard drops datagrams to the VXLAN port from an address no peer's lease publishes; " +
	"if a cluster host sends VXLAN from it, the public IP in its lease is another address of it: " +
	"its --public-ip (flanneld's or overlayd's) must be the address its VXLAN datagrams leave from (its --iface address), " +
	"or run overlayd with --vxlan-guard=false until it is; otherwise the source holds no lease and the drop is intended"

// checkRefused reads the VXLAN guards' refused sources into the status,
// logs each source the first time it shows up in this daemon's lifetime,
// and at most once an hour reminds that some still send (refusedLog).
func (d *daemon) checkRefused() {
	now := time.Now()
	if d.refusedLog == nil {
		d.refusedLog = newRefusedLog(refusedRemembered, guard.RefusedTimeout)
	}
	var all []string
	var sources []netip.Addr
	families := map[netip.Addr]string{}
	for _, fp := range d.planes {
		if fp.guard == nil {
			continue
		}
		refused, err := fp.guard.Refused()
		if err != nil {
			d.log.Debug("cannot read the VXLAN guard's refused sources", "family", fp.family, "err", err)
			continue
		}
		for _, a := range refused {
			all = append(all, a.String())
			families[a] = fp.family.String()
		}
		sources = append(sources, refused...)
	}
	for _, a := range d.refusedLog.note(now, sources) {
		d.log.Warn(refusedMsg, "source", a, "family", families[a])
	}
	if n, some, ok := d.refusedLog.reminder(now, refusedRemind, refusedShown); ok {
		d.log.Warn(refusedReminderMsg, "sources", n, "some", some, "within", refusedRemind)
	}
	d.st.set(func(p *probe) { p.refused = all })
}
