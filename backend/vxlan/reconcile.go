package vxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"time"

	"github.com/overlaynet/overlay/backend"
)

// maxDumpAttempts bounds how often one listing is retried when the kernel
// reports it interrupted by a concurrent change.
const maxDumpAttempts = 5

// reconciler brings the kernel to the desired peers, one pass at a time.
// It owns the view, the one model of what the kernel holds, and all that
// passes remember; its methods run only under Backend.opMu.
type reconciler struct {
	cfg   Config
	nl    Netlink
	log   *slog.Logger
	dev   *device
	stats *counters

	// publish updates the Backend's status under its lock; noteDevice
	// tells it which devices the notification filter should watch.
	publish    func(func(s *backend.Status))
	noteDevice func(dev, underlay Link, err error)

	// view is the kernel model: nil until a full pass lists the kernel,
	// and again once a pass fails or the device is recreated, so that the
	// next pass lists it. applied is the desired set the last pass, a
	// successful one if view is set, brought the kernel to.
	view    *view
	applied []Peer

	tornDown  bool
	syncedGen uint64 // generation of the last fully successful pass
	synced    bool   // some pass fully succeeded
	failing   bool   // the last pass failed (for quiet logs)
	// programmed are the peers whose current lease is fully in the kernel,
	// sorted by subnet; usually the desired set itself (shared, not
	// copied: desired slices are never modified).
	programmed []Peer
	conflicted map[netip.Prefix]bool // conflicts already logged
}

var errTornDown = errors.New("vxlan: backend was torn down")

// report publishes the counters, with f for the rest of the status.
func (rec *reconciler) report(f func(s *backend.Status)) {
	st := *rec.stats
	rec.publish(func(s *backend.Status) {
		s.Passes, s.Errors, s.Writes = st.Passes, st.Errors, st.Writes
		s.DriftRepairs, s.DeviceRecreations = st.DriftRepairs, st.DeviceRecreations
		f(s)
	})
}

// ensureDevice is Backend.EnsureDevice under opMu.
func (rec *reconciler) ensureDevice() (DeviceInfo, error) {
	if rec.tornDown {
		return DeviceInfo{}, errTornDown
	}
	dev, underlay, created, err := rec.dev.ensure()
	rec.noteDevice(dev, underlay, err)
	if created || err != nil {
		rec.view = nil // the next pass lists the kernel
	}
	rec.report(func(s *backend.Status) {})
	if err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{Name: dev.Name, Index: dev.Index, MAC: dev.MAC.HardwareAddr(), MTU: dev.MTU}, nil
}

// pass is one reconcile pass on want (generation gen): find out what the
// kernel holds, diff it against want and apply the delta. It reports
// whether it listed the kernel (a full pass).
//
// A full pass ensures the device and replaces the view with a listing,
// one dump per kind. A pass woken by SetPeers alone (onlyPeers) after a
// successful one lists nothing: it diffs the peers that changed against
// the view's entries for them, so a lease event costs its own writes, not
// a listing of every peer's entries. The view is then current but for
// changes the notifications report (deletions of wanted entries, link
// changes: they wake a full pass instead) and silent drift, which the
// periodic resync, a full pass, finds. A change to a peer whose subnet
// another program's route holds gets a full pass too: only a listing tells
// whether that route is still there.
func (rec *reconciler) pass(want []Peer, gen uint64, onlyPeers bool) (full bool, err error) {
	if rec.tornDown {
		return true, errTornDown
	}
	start := time.Now()
	rec.stats.Passes++
	okBefore := rec.stats.okWrites

	var p plan
	var gone, come []Peer
	full = !onlyPeers || rec.view == nil
	if !full {
		gone, come = specDelta(rec.applied, want)
		if full = anyIn(rec.conflicted, gone, come); !full {
			p = diff(come, rec.view.scoped(gone, come))
		}
	}
	created := false
	if full {
		if created, err = rec.listKernel(len(want)); err != nil {
			return true, rec.finish(start, gen, want, err, nil, nil)
		}
		p = diff(want, rec.view)
	}
	// The guard admits the peers this pass may write entries for (every
	// desired peer in a full pass; those that came since the last one
	// otherwise) before any write, and lets the leaving ones go once
	// theirs are removed (settle).
	settle := full || len(gone) > 0
	var admitErr *AdmitError
	if gate := rec.cfg.Gate; gate != nil {
		admit := want
		if !full {
			admit = come
		}
		if err := gate.Admit(admit, full); err != nil {
			// Only the peers that may not be admitted wait: a peer's
			// FDB entry never goes in while its traffic to us would be
			// dropped, but departures and the others' repairs do not
			// wait for the guard.
			admitErr = &AdmitError{Err: err, Held: rec.holdBack(&p, admit)}
		}
	}
	res := rec.apply(&p)

	// Writes in a pass whose desired state had already been applied in
	// full are repairs of drift: someone or something changed the kernel.
	if repaired := rec.stats.okWrites - okBefore; repaired > 0 && !created && rec.synced && gen == rec.syncedGen {
		rec.stats.DriftRepairs += repaired
		rec.log.Info("repaired drift in kernel state", "entries", repaired)
	}
	if len(res.removed) > logEach {
		rec.log.Info("peers removed", "removed", len(res.removed))
	}
	if rec.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, r := range res.removed {
			rec.log.Debug("peer removed from the kernel", "peer", r.Dst, "via", r.Gw)
		}
	}
	conflicts := rec.noteConflicts(p.conflicts, full)

	var werr error
	switch {
	case admitErr != nil:
		// The held-back peers count as failed (they keep the version
		// the kernel has, if any). The next pass is full: the gate
		// admits every peer again, and the diff finds the held ones.
		// Settle waits for a pass whose Admit succeeded.
		for _, h := range admitErr.Held {
			res.fail(h.Subnet)
		}
		werr, rec.view = admitErr, nil
		if res.err != nil {
			werr = fmt.Errorf("%w; and %w", admitErr, res.err)
		}
	case res.err != nil:
		// The next pass must retry the peers that failed, which only a
		// diff of every peer finds.
		werr, rec.view = res.err, nil
	case rec.cfg.Gate != nil && settle:
		// Every entry of a peer that left is gone: so may its address.
		var left []Peer // nil after a full pass: anything may be stale
		if !full {
			left = gone
		}
		if err := rec.cfg.Gate.Settle(want, left); err != nil {
			// The next pass must be full: an incremental one would not
			// look at the peers that left again, and their addresses
			// would stay admitted until the resync.
			werr, rec.view = fmt.Errorf("VXLAN guard: remove the addresses of peers that left: %w", err), nil
		}
	}
	rec.applied = want
	return full, rec.finish(start, gen, want, werr, &res, conflicts)
}

// listKernel ensures the device and replaces the view with a listing of
// the kernel, sized for peers peers. It reports whether the device was
// (re)created.
func (rec *reconciler) listKernel(peers int) (created bool, err error) {
	rec.view = nil
	dev, underlay, created, err := rec.dev.ensure()
	rec.noteDevice(dev, underlay, err)
	if err != nil {
		return created, err
	}
	env := diffEnv{Family: rec.cfg.fam, Dev: dev.Index, Underlay: underlay.Index, DirectRouting: rec.cfg.DirectRouting}
	have, err := rec.readKernel(env.Dev)
	if err != nil {
		return created, err
	}
	rec.view = viewOf(have, env, peers)
	return created, nil
}

// noteConflicts returns the peers whose subnet another program's route
// holds, logging each new one once. A full pass found all of them; any
// other pass only those among the peers it looked at.
func (rec *reconciler) noteConflicts(found []netip.Prefix, full bool) map[netip.Prefix]bool {
	conflicts := rec.conflicted
	if full {
		conflicts = make(map[netip.Prefix]bool, len(found))
	} else if len(found) > 0 {
		conflicts = maps.Clone(rec.conflicted)
	}
	for _, c := range found {
		conflicts[c] = true
		if !rec.conflicted[c] {
			rec.log.Warn("another program's route holds a peer's subnet; not overwriting it, the peer is unreachable until it is removed",
				"peer", c)
		}
	}
	rec.conflicted = conflicts
	return conflicts
}

// readKernel lists the kernel's routes and the device's neighbours of our
// family, and the device's FDB entries. The other family's overlay, the
// twin of ours on a dual-stack host, is thus never seen, let alone
// touched.
func (rec *reconciler) readKernel(dev int) (kernelState, error) {
	var s kernelState
	var err error
	if s.Routes, err = retryDump(rec.listRoutes); err != nil {
		return s, fmt.Errorf("list %v routes: %w", rec.cfg.fam, err)
	}
	if s.Neighs, err = retryDump(func() ([]Neigh, error) { return rec.nl.NeighListFamily(dev, rec.cfg.fam) }); err != nil {
		return s, fmt.Errorf("list neighbours of %s: %w", rec.dev.name, err)
	}
	if s.FDBs, err = retryDump(func() ([]FDB, error) { return rec.nl.FDBList(dev) }); err != nil {
		return s, fmt.Errorf("list FDB of %s: %w", rec.dev.name, err)
	}
	return s, nil
}

// listRoutes lists the main table's routes of our family.
func (rec *reconciler) listRoutes() ([]Route, error) { return rec.nl.RouteListFamily(rec.cfg.fam) }

// retryDump runs a listing again while the kernel reports it interrupted.
func retryDump[T any](list func() ([]T, error)) ([]T, error) {
	var err error
	for range maxDumpAttempts {
		var out []T
		out, err = list()
		if err == nil {
			return out, nil
		}
		if !isInterrupted(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("listing interrupted %d times in a row by concurrent changes: %w", maxDumpAttempts, err)
}

// logEach is how many peers one pass may add, update or remove without a
// summary line at Info; each peer is logged at Debug only (the daemon logs
// each lease event at Info once, so the backend does not repeat it).
const logEach = 16

// anyIn reports whether a peer of either set has its subnet in conflicted:
// what the kernel holds for it is another program's business, which only a
// listing tells.
func anyIn(conflicted map[netip.Prefix]bool, sets ...[]Peer) bool {
	for _, set := range sets {
		for _, s := range set {
			if conflicted[s.Subnet] {
				return true
			}
		}
	}
	return false
}

// finish records the outcome of a pass: the peers now programmed, status
// and counters, quiet logs.
func (rec *reconciler) finish(start time.Time, gen uint64, want []Peer, err error, res *applyResult, conflicts map[netip.Prefix]bool) error {
	now := time.Now()
	programmed := 0
	if res != nil {
		programmed = rec.track(want, res, conflicts, now)
	}
	if err != nil {
		rec.stats.Errors++
		if !rec.failing {
			rec.log.Warn("reconcile pass failed; retrying with backoff", "err", err)
		} else {
			rec.log.Debug("reconcile pass failed again", "err", err)
		}
		rec.failing = true
	} else {
		if rec.failing {
			rec.log.Info("back in sync", "peers", len(want))
		} else if !rec.synced {
			rec.log.Info("in sync", "peers", len(want), "writes", rec.stats.Writes)
		}
		rec.failing = false
		rec.synced = true
		rec.syncedGen = gen
	}
	rec.report(func(s *backend.Status) {
		s.PeersProgrammed = programmed
		s.Conflicts = len(conflicts)
		s.InSync = err == nil
		s.LastPass = now
		s.PassTime = now.Sub(start)
		s.LastError = err
		if err == nil {
			s.LastSuccess = now
		}
	})
	if f := rec.cfg.OnPass; f != nil {
		f()
	}
	return err
}

// track moves programmed to the peers this pass left fully in the kernel,
// calling the OnPeerProgrammed hook and logging each peer that changed,
// and returns how many there are.
func (rec *reconciler) track(want []Peer, res *applyResult, conflicts map[netip.Prefix]bool, now time.Time) (programmed int) {
	adopted, nAdded, nUpdated := 0, 0, 0
	// The peers themselves are kept only for the debug log: a cold start
	// adds every peer at once.
	debug := rec.log.Enabled(context.Background(), slog.LevelDebug)
	var added, updated []Peer
	var replaced []Peer // the previous versions of updated
	// Walk want and the previously programmed peers (both sorted) side
	// by side. A peer that failed or is in conflict keeps its previous
	// version, if any; the new set is want itself unless one did.
	old := rec.programmed
	var next []Peer // nil while it equals want[:programmed]
	j := 0
	for i, w := range want {
		for j < len(old) && compareSubnet(old[j].Subnet, w.Subnet) < 0 {
			j++
		}
		prev, had := Peer{}, j < len(old) && old[j].Subnet == w.Subnet
		if had {
			prev = old[j]
		}
		if res.peerFailed(w.Subnet, i) || conflicts[w.Subnet] {
			if next == nil {
				next = append(make([]Peer, 0, len(want)), want[:i]...)
			}
			if had {
				next = append(next, prev)
			}
			continue
		}
		programmed++
		if next != nil {
			next = append(next, w)
		}
		if had && prev == w {
			continue
		}
		switch {
		case !res.peerTouched(w.Subnet, i):
			adopted++ // found in place
		case had:
			nUpdated++
			if debug {
				updated, replaced = append(updated, w), append(replaced, prev)
			}
		default:
			nAdded++
			if debug {
				added = append(added, w)
			}
		}
		if f := rec.cfg.OnPeerProgrammed; f != nil {
			f(w, now)
		}
	}
	if next == nil {
		next = want
	}
	rec.programmed = next
	if nAdded+nUpdated > logEach {
		rec.log.Info("peers programmed", "added", nAdded, "updated", nUpdated)
	}
	if debug {
		for i, w := range updated {
			rec.log.Debug("peer updated in the kernel", "peer", w.Subnet, "public_ip", w.PublicIP, "vtep_mac", PeerMAC(w).String(),
				"old_public_ip", replaced[i].PublicIP, "old_vtep_mac", PeerMAC(replaced[i]).String())
		}
		for _, w := range added {
			rec.log.Debug("peer programmed in the kernel", "peer", w.Subnet, "public_ip", w.PublicIP, "vtep_mac", PeerMAC(w).String())
		}
	}
	if adopted > 0 {
		rec.log.Info("adopted peers already programmed in the kernel", "peers", adopted)
	}
	return programmed
}
