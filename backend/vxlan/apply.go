package vxlan

import (
	"fmt"
	"net/netip"
	"slices"
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
	err *WriteError
	// want is the plan's desired peers (sorted by subnet); failed and
	// touched are indexed like it: the peers with a failed or skipped
	// write, and those with a successful one. Flags by index rather than
	// sets of subnets: a cold start records three writes for each of
	// thousands of peers, and hashing each subnet into a growing map cost
	// more CPU than any other user-space step of the pass
	// (Documentation/benchmarks.md, issue 33).
	want    []Peer
	failed  []bool // nil until a write fails
	touched []bool // nil until a write succeeds
	// failedOther are peers marked failed (fail) that the plan does not
	// hold; nil but for a caller's mistake.
	failedOther map[netip.Prefix]bool
	removed     []Route // stale routes removed
}

// index returns the position of the peer with subnet s in r.want, or -1.
// hint is tried first: the index s has in the caller's slice, which is
// r.want itself in a full pass.
func (r *applyResult) index(s netip.Prefix, hint int) int {
	if !s.IsValid() {
		return -1
	}
	if hint >= 0 && hint < len(r.want) && r.want[hint].Subnet == s {
		return hint
	}
	if i, ok := slices.BinarySearchFunc(r.want, s, func(w Peer, s netip.Prefix) int { return compareSubnet(w.Subnet, s) }); ok {
		return i
	}
	return -1
}

// peerFailed and peerTouched report whether peer s (at hint in the
// caller's slice, see index) had a failed or skipped write, or a
// successful one.
func (r *applyResult) peerFailed(s netip.Prefix, hint int) bool {
	i := r.index(s, hint)
	return r.failed != nil && i >= 0 && r.failed[i] || r.failedOther[s]
}

// fail marks the peer on subnet s failed without a write of its own
// failing (the guard held it back).
func (r *applyResult) fail(s netip.Prefix) {
	if i := r.index(s, -1); i >= 0 {
		if r.failed == nil {
			r.failed = make([]bool, len(r.want))
		}
		r.failed[i] = true
		return
	}
	if r.failedOther == nil {
		r.failedOther = map[netip.Prefix]bool{}
	}
	r.failedOther[s] = true
}

func (r *applyResult) peerTouched(s netip.Prefix, hint int) bool {
	i := r.index(s, hint)
	return r.touched != nil && i >= 0 && r.touched[i]
}

// record counts the outcome of write o, which programs r.want[peer] (-1:
// no desired peer's).
func (r *applyResult) record(o op, peer int, err error, total int) {
	if err != nil {
		if r.err == nil {
			r.err = &WriteError{Total: total, First: fmt.Errorf("%v: %w", o, err)}
		}
		r.err.Failed++
		if peer >= 0 {
			if r.failed == nil {
				r.failed = make([]bool, len(r.want))
			}
			r.failed[peer] = true
		}
		return
	}
	if peer >= 0 {
		if r.touched == nil {
			r.touched = make([]bool, len(r.want))
		}
		r.touched[peer] = true
	} else if o.kind == opRouteDel {
		r.removed = append(r.removed, o.route)
	}
}

// peerOf returns the index in p.want of the peer write i of kind k (o)
// programs, or -1 for the removal of an entry no desired peer wants.
func (p *plan) peerOf(r *applyResult, k opKind, i int, o op) int {
	if p.sets[k] != nil {
		return int(p.sets[k][i])
	}
	return r.index(o.peer, -1)
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
	r := applyResult{want: p.want}
	total := 0
	for k := range numOpKinds {
		total += p.count(k)
	}
	chunk := make([]op, 0, applyChunk)
	peers := make([]int, 0, applyChunk) // chunk's peers in p.want
	reqs := make([]Write, 0, applyChunk)
	for k := range numOpKinds {
		n := p.count(k)
		if n < 2 || k == opFDBPrune || k == opRoutePrune {
			for i := range n {
				o := p.at(k, i)
				peer := p.peerOf(&r, k, i, o)
				if peer >= 0 && r.failed != nil && r.failed[peer] {
					r.err.Skipped++
					continue
				}
				r.record(o, peer, rec.exec(o), total)
			}
			continue
		}
		for start := 0; start < n; start += applyChunk {
			chunk, peers = chunk[:0], peers[:0]
			for i := start; i < min(n, start+applyChunk); i++ {
				o := p.at(k, i)
				peer := p.peerOf(&r, k, i, o)
				if peer >= 0 && r.failed != nil && r.failed[peer] {
					r.err.Skipped++
					continue
				}
				chunk, peers = append(chunk, o), append(peers, peer)
			}
			reqs = reqs[:0]
			for _, o := range chunk {
				reqs = append(reqs, o.request())
			}
			for i, err := range rec.nl.Write(reqs) {
				r.record(chunk[i], peers[i], rec.count(chunk[i], err), total)
			}
		}
	}
	return r
}
