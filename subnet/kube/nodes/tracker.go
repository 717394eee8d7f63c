package nodes

import (
	"net/netip"
	"slices"
	"strconv"

	"github.com/overlaynet/overlay/subnet"
)

// Tracker turns the Nodes an informer holds into what a lease watch
// delivers (subnet.Snapshot, subnet.Batch): level-triggered, it is told a
// node's name and current state (nil: deleted), compares what the node
// says as a lease with what it said last, and reports only a change, so a
// node's status heartbeat or an unrelated label re-programs nothing. It is
// pure and owned by one goroutine.
//
// Unlike etcd keys, two Nodes can name one podCIDR (an operator's edit, a
// hostile patch): the node that held it first keeps it, the other is
// invalid (by its name, so that the first one's peer stays) until the
// first lets it go, when it is judged again.
type Tracker struct {
	ann   Annotations
	cfg   *subnet.Config
	data  subnet.DataChecker
	own   string
	seen  map[string]state
	owner map[netip.Prefix]string // each podCIDR of a node in seen, by the node holding it
	// waiting are the nodes refused because another holds their podCIDR.
	waiting map[string]bool
}

// state is what a node was last reported as.
type state struct {
	subnets subnet.Subnets // held (owner); zero for a node refused by name
	lease   subnet.Lease   // valid: the lease
	err     string         // invalid: why
	byName  bool           // invalid, reported by its name (Invalid.Key) with no subnets
}

func (s state) valid() bool { return s.err == "" }

// NewTracker returns a tracker of the network cfg's nodes, with the
// backend's codec data; own is this host's node, which is never a peer
// (its podCIDR is still held against any other node naming it).
func NewTracker(ann Annotations, cfg *subnet.Config, data subnet.DataChecker, own string) *Tracker {
	return &Tracker{ann: ann, cfg: cfg, data: data, own: own, seen: map[string]state{}, owner: map[netip.Prefix]string{}, waiting: map[string]bool{}}
}

// Key is the name a lease watch gives node name's lease (Invalid.Key,
// subnet.Source.LeaseName): "node/<name>".
func Key(name string) string { return "node/" + name }

// Reset forgets everything and reads every node (sorted by name: the
// first of two naming one podCIDR keeps it), returning the lease set.
func (t *Tracker) Reset(all []Node) subnet.Snapshot {
	t.seen, t.owner, t.waiting = map[string]state{}, map[netip.Prefix]string{}, map[string]bool{}
	all = slices.Clone(all)
	slices.SortFunc(all, func(a, b Node) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	var snap subnet.Snapshot
	for i := range all {
		b := t.Update(all[i].Name, &all[i], nil)
		for _, ev := range b.Events {
			snap.Leases = append(snap.Leases, ev.Lease)
		}
		snap.Invalid = append(snap.Invalid, b.Invalid...)
	}
	return snap
}

// Update reads node name as it is now (n; nil if deleted) and returns
// what changed, as a batch: nothing if the node says what it said last.
// lookup, if set, returns a node's current state (nil: none): the nodes
// that were refused for a podCIDR name frees are judged again, each in a
// batch of its own after this one (appended to more, in order).
func (t *Tracker) Update(name string, n *Node, lookup func(string) *Node) subnet.Batch {
	b, freed := t.update(name, n)
	if lookup == nil || len(freed) == 0 {
		return b
	}
	// A node judged again goes in the same batch if it is not in it
	// already (a batch names a key once: see subnet.Batch).
	for _, other := range t.waitingFor(freed) {
		if other == name {
			continue
		}
		ob, _ := t.update(other, lookup(other))
		b.Events = append(b.Events, ob.Events...)
		b.Deleted = append(b.Deleted, ob.Deleted...)
		b.Invalid = append(b.Invalid, ob.Invalid...)
	}
	return b
}

// waitingFor returns, sorted, the nodes refused for a podCIDR in freed.
func (t *Tracker) waitingFor(freed []netip.Prefix) []string {
	var out []string
	for name := range t.waiting {
		out = append(out, name)
	}
	slices.Sort(out)
	_ = freed // every waiting node is judged again: they are few (a conflict is an operator's error)
	return out
}

// update is Update for one node; it returns the podCIDRs it freed.
func (t *Tracker) update(name string, n *Node) (subnet.Batch, []netip.Prefix) {
	prev, had := t.seen[name]
	delete(t.waiting, name) // judge marks it again if it still waits
	cur, present := t.judge(name, n)
	var b subnet.Batch
	// Release what prev held that cur does not.
	var freed []netip.Prefix
	for _, p := range []netip.Prefix{prev.subnets.IPv4, prev.subnets.IPv6} {
		if p.IsValid() && t.owner[p] == name && (!present || p != cur.subnets.IPv4 && p != cur.subnets.IPv6) {
			delete(t.owner, p)
			freed = append(freed, p)
		}
	}
	if present {
		for _, p := range []netip.Prefix{cur.subnets.IPv4, cur.subnets.IPv6} {
			if p.IsValid() {
				t.owner[p] = name
			}
		}
		t.seen[name] = cur
	} else {
		delete(t.seen, name)
	}
	if name == t.own {
		return b, freed // never a peer, never reported
	}
	if had && present && same(prev, cur) {
		return b, freed
	}
	if had && prev.subnets != (subnet.Subnets{}) && (!present || prev.subnets != cur.subnets) {
		s := prev.subnets
		b.Events = append(b.Events, subnet.Event{Type: subnet.Removed, Lease: subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6}})
	}
	if had && prev.byName && (!present || !cur.byName) {
		b.Deleted = append(b.Deleted, Key(name))
	}
	switch {
	case !present:
	case cur.valid():
		typ := subnet.Added
		if had && prev.valid() && prev.subnets == cur.subnets {
			typ = subnet.Changed
		}
		b.Events = append(b.Events, subnet.Event{Type: typ, Lease: cur.lease})
	default:
		b.Invalid = append(b.Invalid, subnet.Invalid{Key: Key(name), Subnets: cur.subnets, ModRevision: cur.lease.ModRevision, Err: errorString(cur.err)})
	}
	return b, freed
}

// judge is what node n says now; present false if it is no lease at all
// (deleted, or not taking part).
func (t *Tracker) judge(name string, n *Node) (state, bool) {
	if n == nil {
		return state{}, false
	}
	if name == t.own {
		s, err := PodCIDRs(*n)
		if err != nil {
			return state{}, false
		}
		return state{subnets: s}, true
	}
	l, ok, err := t.ann.Check(t.cfg, t.data, *n)
	if !ok {
		return state{}, false
	}
	if err == nil {
		for _, p := range []netip.Prefix{l.Subnet, l.IPv6Subnet} {
			if holder, held := t.owner[p]; p.IsValid() && held && holder != name {
				t.waiting[name] = true
				return state{err: nodeError("podCIDR %s is node %s's too (it held it first): two nodes cannot share a subnet; fix the podCIDRs (kubectl get nodes -o custom-columns=NAME:.metadata.name,CIDRS:.spec.podCIDRs)", p, holder).Error(), byName: true}, true
			}
		}
		return state{subnets: l.Subnets(), lease: l}, true
	}
	s := subnet.Subnets{IPv4: l.Subnet, IPv6: l.IPv6Subnet}
	for _, p := range []netip.Prefix{s.IPv4, s.IPv6} {
		if holder, held := t.owner[p]; p.IsValid() && held && holder != name {
			// Invalid, and on another node's subnet: reported by name,
			// so that the other node's peer stays.
			s = subnet.Subnets{}
		}
	}
	return state{subnets: s, lease: subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6}, err: err.Error(), byName: s == (subnet.Subnets{})}, true
}

// same reports whether a and b say the same thing.
func same(a, b state) bool {
	if a.subnets != b.subnets || a.err != b.err || a.byName != b.byName {
		return false
	}
	return !a.valid() || subnet.SameAttrs(a.lease.Attrs, b.lease.Attrs)
}

// Node names the node holding subnets s ("" if none does), for messages.
func (t *Tracker) Node(s subnet.Subnets) string {
	for _, p := range []netip.Prefix{s.IPv4, s.IPv6} {
		if name, ok := t.owner[p]; p.IsValid() && ok {
			return name
		}
	}
	return ""
}

// errorString is a judgement kept as text (a state is compared as a
// value), still an invalid lease for errors.Is.
type errorString string

func (e errorString) Error() string { return string(e) }
func (e errorString) Unwrap() error { return subnet.ErrInvalidLease }

// Revision reads a resourceVersion as a number for logs and the daemon's
// once-per-revision reporting; 0 if it is not one (the API server makes
// no promise about its form).
func Revision(resourceVersion string) int64 {
	n, err := strconv.ParseInt(resourceVersion, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
