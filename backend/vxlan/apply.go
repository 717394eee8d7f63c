package vxlan

import (
	"fmt"
	"net/netip"
)

// WriteError is the error of a pass in which some kernel writes failed. The
// pass still applied every write it could.
type WriteError struct {
	Failed  int   // writes that failed
	Skipped int   // writes not tried because an earlier write for the same peer failed
	Total   int   // writes the pass planned
	First   error // the first failure, naming the write
}

func (e *WriteError) Error() string {
	s := fmt.Sprintf("%d of %d kernel writes failed", e.Failed, e.Total)
	if e.Skipped > 0 {
		s += fmt.Sprintf(" (%d more skipped)", e.Skipped)
	}
	return s + "; first: " + e.First.Error()
}

func (e *WriteError) Unwrap() error { return e.First }

// exec runs one write as a batch of one.
func (rec *reconciler) exec(o op) error {
	return rec.count(o, rec.nl.Write([]Write{o.request()})[0])
}

// count records the outcome of one write, in the counters and, when it
// succeeded, in the view: already gone is what a deletion wanted.
func (rec *reconciler) count(o op, err error) error {
	rec.stats.Writes++
	if err != nil && o.kind.isDelete() && isNotFound(err) {
		err = nil
	}
	if err == nil {
		rec.stats.okWrites++
		if rec.view != nil {
			rec.view.record(o)
		}
	}
	return err
}

// applyChunk is how many writes apply builds and hands to Netlink.Write at
// a time.
const applyChunk = 128

type applyResult struct {
	err     *WriteError
	failed  map[netip.Prefix]bool // desired peers with a failed or skipped write
	touched map[netip.Prefix]bool // desired peers with a successful write
	removed []Route               // stale routes removed
}

func (r *applyResult) record(o op, err error, total int) {
	if err != nil {
		if r.err == nil {
			r.err = &WriteError{Total: total, First: fmt.Errorf("%v: %w", o, err)}
		}
		r.err.Failed++
		if o.peer.IsValid() {
			if r.failed == nil {
				r.failed = make(map[netip.Prefix]bool)
			}
			r.failed[o.peer] = true
		}
		return
	}
	if o.peer.IsValid() {
		if r.touched == nil {
			r.touched = make(map[netip.Prefix]bool)
		}
		r.touched[o.peer] = true
	} else if o.kind == opRouteDel {
		r.removed = append(r.removed, o.route)
	}
}

// apply runs the plan in order. A failed write does not stop the pass (one
// bad peer must not hold up the others) but skips the rest of that peer's
// writes, so a route never goes in without its neighbour and FDB entry.
//
// The plan's writes come by kind (all neighbours, then all FDB entries,
// then all routes...). The writes of one kind concern distinct peers, so
// none depends on another's outcome: Netlink.Write gets them applyChunk at
// a time, and the next kind only starts once the outcome of every write of
// this one is known, which keeps the skipping exact. The prune kinds,
// which may hold several writes for one peer, go one by one.
func (rec *reconciler) apply(p *plan) applyResult {
	var r applyResult
	total := 0
	for k := range numOpKinds {
		total += p.count(k)
	}
	chunk := make([]op, 0, applyChunk)
	reqs := make([]Write, 0, applyChunk)
	for k := range numOpKinds {
		n := p.count(k)
		if n < 2 || k == opFDBPrune || k == opRoutePrune {
			for i := range n {
				o := p.at(k, i)
				if o.peer.IsValid() && r.failed[o.peer] {
					r.err.Skipped++
					continue
				}
				r.record(o, rec.exec(o), total)
			}
			continue
		}
		for start := 0; start < n; start += applyChunk {
			chunk = chunk[:0]
			for i := start; i < min(n, start+applyChunk); i++ {
				o := p.at(k, i)
				if o.peer.IsValid() && r.failed[o.peer] {
					r.err.Skipped++
					continue
				}
				chunk = append(chunk, o)
			}
			reqs = reqs[:0]
			for _, o := range chunk {
				reqs = append(reqs, o.request())
			}
			for i, err := range rec.nl.Write(reqs) {
				r.record(chunk[i], rec.count(chunk[i], err), total)
			}
		}
	}
	return r
}
