package vxlan

import (
	"errors"
	"fmt"

	"github.com/overlaynet/overlay/backend"
)

// teardown is Backend.Teardown under opMu: it lists what is ours (by route
// protocol, family and device) rather than trusting the view, so it also
// removes what a previous run left, and nothing of the other family's
// overlay.
func (rec *reconciler) teardown() error {
	rec.tornDown = true
	rec.view = nil
	defer rec.report(func(s *backend.Status) { s.DevicePresent, s.InSync, s.PeersProgrammed = false, false, 0 })

	var errs []error
	var removedRoutes, removedFDB, removedNeighs int
	deviceRemoved := false
	devIdx, ulIdx := -1, -1
	if dev, err := rec.nl.LinkByName(rec.dev.name); err == nil {
		devIdx = dev.Index
	} else if !errors.Is(err, ErrLinkNotFound) {
		errs = append(errs, fmt.Errorf("look up %s: %w", rec.dev.name, err))
	}
	if ul, err := rec.dev.lookupUnderlay(); err == nil {
		ulIdx = ul.Index
	}
	routes, err := retryDump(rec.listRoutes)
	if err != nil {
		errs = append(errs, fmt.Errorf("list %v routes: %w", rec.cfg.fam, err))
	}
	for _, r := range routes {
		if r.Protocol == RouteProtocol && (r.LinkIndex == devIdx || r.LinkIndex == ulIdx) {
			if err := rec.exec(op{kind: opRouteDel, route: r}); err != nil {
				errs = append(errs, fmt.Errorf("delete route %v: %w", r, err))
			} else {
				removedRoutes++
			}
		}
	}
	if devIdx > 0 {
		fdbs, err := retryDump(func() ([]FDB, error) { return rec.nl.FDBList(devIdx) })
		if err != nil {
			errs = append(errs, fmt.Errorf("list FDB of %s: %w", rec.dev.name, err))
		}
		for _, f := range fdbs {
			if err := rec.exec(op{kind: opFDBDel, fdb: f}); err != nil {
				errs = append(errs, fmt.Errorf("delete FDB entry %v: %w", f, err))
			} else {
				removedFDB++
			}
		}
		neighs, err := retryDump(func() ([]Neigh, error) { return rec.nl.NeighListFamily(devIdx, rec.cfg.fam) })
		if err != nil {
			errs = append(errs, fmt.Errorf("list neighbours of %s: %w", rec.dev.name, err))
		}
		for _, n := range neighs {
			if n.State&NUDPermanent != 0 {
				if err := rec.exec(op{kind: opNeighDel, neigh: n}); err != nil {
					errs = append(errs, fmt.Errorf("delete neighbour %v: %w", n, err))
				} else {
					removedNeighs++
				}
			}
		}
		switch err := rec.stats.write(func() error { return rec.nl.LinkDel(devIdx) }); {
		case err == nil:
			deviceRemoved = true
		case !isNotFound(err):
			errs = append(errs, fmt.Errorf("delete device %s: %w", rec.dev.name, err))
		}
	}
	rec.programmed = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("teardown of %s incomplete (run it again): %w", rec.dev.name, err)
	}
	// Say what was there: a teardown of a host without overlay (or a
	// second one) removes nothing and must not claim it did.
	counts := []any{"routes", removedRoutes, "neighbours", removedNeighs, "fdb_entries", removedFDB}
	switch {
	case deviceRemoved:
		rec.log.Info("removed overlay device", counts...)
	case removedRoutes > 0:
		rec.log.Info("removed overlay routes; no overlay device was there", counts...)
	default:
		rec.log.Info("nothing to remove: no overlay device or routes")
	}
	return nil
}
