package guard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// ErrInvalidConfig is returned by New for a family or port it cannot use.
var ErrInvalidConfig = errors.New("invalid VXLAN guard configuration")

// DefaultTimeout bounds each netlink operation (one dump or one batch).
const DefaultTimeout = 10 * time.Second

// chunk is how many elements one transaction adds or deletes: the batch
// is one sendmsg, which must fit the socket's send buffer (~200 KiB by
// default; an IPv6 element takes about 40 bytes).
const chunk = 2048

// Gate keeps one address family's part of table inet overlay-guard in one
// network namespace: the set of admitted peer addresses and the chain that
// drops UDP to the VXLAN port from anyone else. It implements backend.Gate;
// its family's data plane drives it. Its methods are safe for concurrent
// use.
type Gate struct {
	fam     backend.Family
	spec    famSpec
	port    uint16
	ns      netns.NsHandle // owned: closed by Close
	timeout time.Duration

	// nsMu guards closed and ns: every method that talks to the kernel
	// holds it shared, Close alone exclusively.
	nsMu   sync.RWMutex
	closed bool

	// mu orders Admit and Settle and guards the fields below it to cmu.
	mu sync.Mutex
	// view is what the set holds as far as the Gate knows: read at the
	// first Admit and at every resync, then kept by each write. nil
	// means unknown (never read, or a write failed).
	view    addrSet
	mark    uint32 // the mark of the last Settle (addrSet.stale)
	batches uint64 // transactions sent to the kernel
	log     *slog.Logger
	// repairs counts what resyncs put back that something outside the
	// Gate had changed (read with Repairs).
	repairs atomic.Uint64

	// cmu guards the drop count apart from mu, so that a metrics scrape
	// never waits for a long Admit.
	cmu sync.Mutex
	// The drop counter lives in the rule and restarts at zero when the
	// rule is put back: base is what earlier rules had counted, last
	// the current rule's count at the last read.
	base, last uint64
}

var _ backend.Gate = (*Gate)(nil)

// Option configures New.
type Option func(*options) error

type options struct {
	ns      netns.NsHandle
	nsSet   bool
	timeout time.Duration
	log     *slog.Logger
}

// WithLogger logs each repair of drift (Warn) to log.
func WithLogger(log *slog.Logger) Option {
	return func(o *options) error {
		o.log = log
		return nil
	}
}

// WithNetNS programs the network namespace ns instead of the one the
// calling thread of New is in. The Gate keeps its own duplicate of the
// handle.
func WithNetNS(ns netns.NsHandle) Option {
	return func(o *options) error {
		if !ns.IsOpen() {
			return fmt.Errorf("network namespace handle %d is not open: %w", int(ns), ErrInvalidConfig)
		}
		o.ns, o.nsSet = ns, true
		return nil
	}
}

// WithTimeout bounds each netlink operation (default DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("timeout %v is not positive: %w", d, ErrInvalidConfig)
		}
		o.timeout = d
		return nil
	}
}

// New returns the Gate of family fam for VXLAN on UDP port port. It
// touches nothing in the kernel: the first Admit does.
func New(fam backend.Family, port int, opts ...Option) (*Gate, error) {
	if fam != backend.IPv4 && fam != backend.IPv6 {
		return nil, fmt.Errorf("address family %d: want IPv4 or IPv6: %w", fam, ErrInvalidConfig)
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("UDP port %d: want 1-65535: %w", port, ErrInvalidConfig)
	}
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	ns, err := ownHandle(o.ns, o.nsSet)
	if err != nil {
		return nil, err
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return &Gate{fam: fam, spec: specOf(fam), port: uint16(port), ns: ns, timeout: o.timeout, log: o.log}, nil
}

// ownHandle returns a namespace handle of our own: a duplicate of ns if
// set, else the calling thread's namespace.
func ownHandle(ns netns.NsHandle, set bool) (netns.NsHandle, error) {
	if !set {
		h, err := netns.Get()
		if err != nil {
			return netns.None(), fmt.Errorf("open the current network namespace: %w", err)
		}
		return h, nil
	}
	fd, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return netns.None(), fmt.Errorf("duplicate network namespace handle %d: %w", int(ns), err)
	}
	return netns.NsHandle(fd), nil
}

// Family is the address family the Gate guards.
func (g *Gate) Family() backend.Family { return g.fam }

// Close releases the namespace handle and leaves the table in place (a
// restarting daemon adopts it without a gap). Safe to call twice.
func (g *Gate) Close() error {
	g.nsMu.Lock()
	defer g.nsMu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return g.ns.Close()
}

// Batches is how many transactions the Gate has sent to the kernel.
func (g *Gate) Batches() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.batches
}

// ErrClosed is returned by every method called after Close.
var ErrClosed = errors.New("VXLAN guard is closed")

// Admit implements backend.Gate: it adds the peers' public addresses the
// set lacks. With resync, or before the first read, it reads the set,
// chain and rule back from the kernel first and puts back whatever is
// missing or wrong, in one transaction with the elements.
func (g *Gate) Admit(peers []backend.Peer, resync bool) error {
	g.nsMu.RLock()
	defer g.nsMu.RUnlock()
	if g.closed {
		return ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !resync && g.view != nil {
		return g.write(g.view.addMissing(peers), nil, nil)
	}
	g.cmu.Lock()
	k, err := read(g.ns, g.timeout, g.spec, g.port)
	if err == nil {
		g.noteCounter(k)
	}
	g.cmu.Unlock()
	if err != nil {
		g.view = nil
		return err
	}
	old := g.view
	g.view = k.elems
	add := g.view.addMissing(peers)
	var drift []string
	var repaired uint64
	if old != nil {
		// The Gate had the guard in place: whatever is missing now,
		// something else took away.
		drift, repaired = k.drift(g.spec, old, add)
	}
	var err2 error
	if k.setOK && k.refusedOK && k.ruleOK {
		err2 = g.write(add, nil, nil)
	} else {
		err2 = g.write(add, &k, nil)
	}
	if err2 == nil && len(drift) > 0 {
		g.repairs.Add(repaired)
		g.log.Warn("VXLAN guard: put back what something other than overlayd changed in its nftables table", "family", g.fam,
			"table", "inet "+TableName, "restored", strings.Join(drift, ", "))
	}
	return err2
}

// Repairs counts the objects (set, chain with its rules) and admitted
// addresses that resyncs put back after something other than the Gate
// changed them.
func (g *Gate) Repairs() uint64 { return g.repairs.Load() }

// drift names what a resync puts back, and counts it: the objects that
// are missing or wrong, and the admitted addresses of old (the view
// before) it re-adds (in add), each one.
func (k kernelState) drift(s famSpec, old addrSet, add []netip.Addr) (out []string, n uint64) {
	if !k.setOK {
		out = append(out, "set "+s.set)
	}
	if !k.refusedOK {
		out = append(out, "set "+s.refused)
	}
	if !k.ruleOK {
		out = append(out, "chain "+s.chain+" with its rules")
	}
	n = uint64(len(out))
	var addrs uint64
	for _, a := range add {
		if _, had := old[a]; had {
			addrs++
		}
	}
	if addrs > 0 {
		out = append(out, fmt.Sprintf("%d admitted address(es) in set %s", addrs, s.set))
	}
	return out, n + addrs
}

// Settle implements backend.Gate: it removes the addresses of gone that
// no peer of keep has, or, with gone nil, every address keep does not
// have.
func (g *Gate) Settle(keep, gone []backend.Peer) error {
	g.nsMu.RLock()
	defer g.nsMu.RUnlock()
	if g.closed {
		return ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.view == nil {
		return nil // never read: Admit has not run, or failed; it reads first
	}
	if gone != nil && len(gone) <= leftScan {
		return g.write(nil, nil, g.view.left(keep, gone))
	}
	g.mark++
	return g.write(nil, nil, g.view.stale(keep, g.mark))
}

// write adds add (already in the view: a failure forgets the view) and
// deletes del, chunk elements per transaction; with
// repair (what read found), it also puts the set, chain and rule back:
// the set first, with its elements, and the chain with its rule in the
// last transaction, so the rule never drops while the set is being
// filled.
func (g *Gate) write(add []netip.Addr, repair *kernelState, del []netip.Addr) error {
	if len(add) == 0 && len(del) == 0 && repair == nil {
		return nil
	}
	table := &nftables.Table{Family: ourTable.Family, Name: ourTable.Name}
	set := g.spec.newSet(table)
	refused := g.spec.newRefusedSet(table)
	n := max(1, (len(add)+chunk-1)/chunk)
	for i := range n {
		batch := add[min(i*chunk, len(add)):min((i+1)*chunk, len(add))]
		count := len(batch)
		c, err := g.conn()
		if err != nil {
			g.view = nil
			return err
		}
		if repair != nil && i == 0 {
			c.AddTable(table)
			badSet, badRefused := repair.setFound && !repair.setOK, repair.refusedFound && !repair.refusedOK
			if (badSet || badRefused) && repair.chainFound {
				// A set of another shape: the rules refer to it by name, so
				// the chain goes first, and comes back in the last batch.
				c.DelChain(g.spec.newChain(table))
				repair.chainFound = false
			}
			if badSet {
				c.DelSet(set)
			}
			if badRefused {
				c.DelSet(refused)
			}
			if !repair.refusedOK {
				if err := c.AddSet(refused, nil); err != nil {
					return fmt.Errorf("add set %s to %s: %w", g.spec.refused, desc, err)
				}
			}
			if !repair.setOK {
				if err := c.AddSet(set, elements(batch)); err != nil {
					return fmt.Errorf("add set %s to %s: %w", g.spec.set, desc, err)
				}
				batch = nil
			}
		}
		if len(batch) > 0 {
			if err := c.SetAddElements(set, elements(batch)); err != nil {
				return fmt.Errorf("add elements to set %s of %s: %w", g.spec.set, desc, err)
			}
		}
		if repair != nil && i == n-1 {
			chain := g.spec.newChain(table)
			if repair.chainFound {
				c.DelChain(chain)
			}
			c.AddChain(chain)
			c.AddRule(g.spec.newRecordRule(table, chain, g.port, set.ID, refused.ID))
			c.AddRule(g.spec.newRule(table, chain, g.port, set.ID))
		}
		g.batches++
		if err := c.Flush(); err != nil {
			g.view = nil // what went in is unknown: read again
			what := fmt.Sprintf("admit %d %v peer address(es) to set %s of %s", count, g.fam, g.spec.set, desc)
			if repair != nil && (i == 0 || i == n-1) {
				what += " and put back its sets, chain and rules"
			}
			return fmt.Errorf("%s in netns %s: %w%s", what, g.ns, err, kernelHint(err))
		}
		if repair != nil && i == n-1 {
			// The rule is new: its counter starts again.
			g.cmu.Lock()
			g.base, g.last = g.base+g.last, 0
			g.cmu.Unlock()
		}
	}
	for i := 0; i < len(del); i += chunk {
		batch := del[i:min(i+chunk, len(del))]
		c, err := g.conn()
		if err != nil {
			g.view = nil
			return err
		}
		if err := c.SetDeleteElements(set, elements(batch)); err != nil {
			return fmt.Errorf("delete elements from set %s of %s: %w", g.spec.set, desc, err)
		}
		g.batches++
		if err := c.Flush(); err != nil {
			g.view = nil
			return fmt.Errorf("remove %d %v address(es) of peers that left from set %s of %s in netns %s: %w", len(batch), g.fam, g.spec.set, desc, g.ns, err)
		}
		for _, a := range batch {
			delete(g.view, a)
		}
	}
	return nil
}

// kernelHint explains a batch the kernel refused as unsupported. ENOENT
// gets none: it also means that something deleted the table or a set
// between our read and our write, which the next resync repairs.
func kernelHint(err error) string {
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT) {
		return " (" + needs + ")"
	}
	return ""
}

// needs is what the guard needs of the kernel, and what to do without it.
const needs = "the VXLAN guard needs nf_tables in family inet with fib, set lookups and dynamic sets with timeouts: Linux 4.10 or later with CONFIG_NF_TABLES_INET, CONFIG_NFT_FIB_INET and CONFIG_NFT_SET_HASH; on a kernel without them run overlayd with --vxlan-guard=false and filter UDP to the VXLAN port on the underlay"

// leftScan is the most peers gone in one pass that Settle looks for one
// by one in keep; beyond it, it marks keep in the view instead.
const leftScan = 32

// desc names the table in messages.
const desc = "table inet " + TableName

// noteCounter takes in the drop counter of a read: a smaller count, or
// no rule, means the rule was put back (or deleted) since the last read.
func (g *Gate) noteCounter(k kernelState) {
	if !k.ruleOK || k.dropped < g.last {
		g.base, g.last = g.base+g.last, 0
	}
	if k.ruleOK {
		g.last = k.dropped
	}
}

// Snapshot is what the kernel holds of one family's guard, read only.
type Snapshot struct {
	Present  bool         // the set, chain and rule are all there and right
	Admitted []netip.Addr // the set's elements, sorted
	Dropped  uint64       // datagrams the rule dropped (for a Gate: since it was made, across rule rewrites)
	// Refused are the sources of the datagrams dropped in the last
	// RefusedTimeout (at most RefusedMax of them), sorted.
	Refused []netip.Addr
}

// Snapshot reads the Gate's set and rule from the kernel, changing
// nothing: the admitted addresses (for `overlayd doctor` to compare with
// the leases) and the drop count (for the metric).
func (g *Gate) Snapshot() (Snapshot, error) {
	g.nsMu.RLock()
	defer g.nsMu.RUnlock()
	if g.closed {
		return Snapshot{}, ErrClosed
	}
	g.cmu.Lock()
	defer g.cmu.Unlock()
	k, err := read(g.ns, g.timeout, g.spec, g.port)
	if err != nil {
		return Snapshot{}, err
	}
	g.noteCounter(k)
	s := k.snapshot()
	s.Dropped = g.base + g.last
	return s, nil
}

// Dropped reads the drop count from the kernel: datagrams the Gate's rule
// dropped since the Gate was made, counting across the rule's rewrites
// (the kernel's counter starts again with each). It lists the rule only,
// not the set, so a scrape costs the same with 10 peers or 10,000.
func (g *Gate) Dropped() (uint64, error) {
	g.nsMu.RLock()
	defer g.nsMu.RUnlock()
	if g.closed {
		return 0, ErrClosed
	}
	g.cmu.Lock()
	defer g.cmu.Unlock()
	k, err := readRule(g.ns, g.timeout, g.spec, g.port)
	if err != nil {
		return 0, err
	}
	g.noteCounter(k)
	return g.base + g.last, nil
}

// readRule is read without the set: what the drop count needs.
func readRule(ns netns.NsHandle, timeout time.Duration, s famSpec, port uint16) (kernelState, error) {
	var k kernelState
	c, err := dial(ns, timeout)
	if err != nil {
		return k, err
	}
	table := &nftables.Table{Family: ourTable.Family, Name: ourTable.Name}
	rules, err := c.GetRules(table, s.newChain(table))
	switch {
	case errors.Is(err, unix.ENOENT):
		return k, nil // no table or no chain: no rule
	case err != nil:
		return k, fmt.Errorf("list the rules of chain %s of %s in netns %s: %w", s.chain, desc, ns, err)
	}
	if rulesRight(rules, table, s, port) {
		k.ruleOK = true
		k.dropped, _ = counterOf(rules[1])
	}
	return k, nil
}

// rulesRight reports whether a chain's rules are exactly ours: the one
// that records refused sources, then the one that drops.
func rulesRight(rules []*nftables.Rule, table *nftables.Table, s famSpec, port uint16) bool {
	return len(rules) == 2 &&
		ruleText(rules[0]) == ruleText(s.newRecordRule(table, nil, port, 0, 0)) &&
		ruleText(rules[1]) == ruleText(s.newRule(table, nil, port, 0))
}

// Refused reads the sources of the datagrams the guard dropped in the
// last RefusedTimeout from the kernel (at most RefusedMax), sorted: what
// the daemon logs and shows in its status. It lists the refused set only.
func (g *Gate) Refused() ([]netip.Addr, error) {
	g.nsMu.RLock()
	defer g.nsMu.RUnlock()
	if g.closed {
		return nil, ErrClosed
	}
	return readRefused(g.ns, g.timeout, g.spec)
}

func readRefused(ns netns.NsHandle, timeout time.Duration, s famSpec) ([]netip.Addr, error) {
	c, err := dial(ns, timeout)
	if err != nil {
		return nil, err
	}
	table := &nftables.Table{Family: ourTable.Family, Name: ourTable.Name}
	elems, err := c.GetSetElements(s.newRefusedSet(table))
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil // no table or no set: nothing recorded
	case err != nil:
		return nil, fmt.Errorf("list set %s of %s in netns %s: %w", s.refused, desc, ns, err)
	}
	var out []netip.Addr
	for _, e := range elems {
		if a, ok := s.addrOf(e.Key); ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// Read reads family fam's guard of VXLAN port port in namespace ns (a
// closed handle: the calling thread's), changing nothing.
func Read(ns netns.NsHandle, fam backend.Family, port int) (Snapshot, error) {
	if port < 1 || port > 65535 {
		return Snapshot{}, fmt.Errorf("UDP port %d: want 1-65535: %w", port, ErrInvalidConfig)
	}
	k, err := read(ns, DefaultTimeout, specOf(fam), uint16(port))
	if err != nil {
		return Snapshot{}, err
	}
	return k.snapshot(), nil
}

func (k kernelState) snapshot() Snapshot {
	s := Snapshot{Present: k.setOK && k.refusedOK && k.ruleOK, Dropped: k.dropped, Refused: k.refused}
	for a := range k.elems {
		s.Admitted = append(s.Admitted, a)
	}
	slices.SortFunc(s.Admitted, netip.Addr.Compare)
	return s
}

// Remove deletes the guard's table with both families' sets and chains in
// namespace ns (a closed handle: the calling thread's), and reports
// whether there was one.
func Remove(ns netns.NsHandle) (bool, error) {
	c, err := dial(ns, DefaultTimeout)
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(ourTable.Family)
	if err != nil {
		return false, fmt.Errorf("list nftables tables in netns %s: %w", ns, err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == ourTable.Name }) {
		return false, nil
	}
	t := ourTable
	c.DelTable(&t)
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("delete %s in netns %s: %w", desc, ns, err)
	}
	return true, nil
}

// RemoveFamily deletes family fam's set and chain from the guard's table
// in namespace ns (a closed handle: the calling thread's), leaving the
// other family's, and reports whether there was either: what a host does
// once its network stops carrying that family, whose VXLAN device is gone.
func RemoveFamily(ns netns.NsHandle, fam backend.Family) (bool, error) {
	s := specOf(fam)
	k, err := read(ns, DefaultTimeout, s, 0)
	if err != nil {
		return false, err
	}
	if !k.setFound && !k.refusedFound && !k.chainFound {
		return false, nil
	}
	c, err := dial(ns, DefaultTimeout)
	if err != nil {
		return false, err
	}
	table := &nftables.Table{Family: ourTable.Family, Name: ourTable.Name}
	if k.chainFound { // first: its rule refers to the set
		c.DelChain(s.newChain(table))
	}
	if k.setFound {
		c.DelSet(s.newSet(table))
	}
	if k.refusedFound {
		c.DelSet(s.newRefusedSet(table))
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("delete the %v set and chain of %s in netns %s: %w", fam, desc, ns, err)
	}
	return true, nil
}

// kernelState is what read found of one family's guard.
type kernelState struct {
	setFound, setOK         bool
	refusedFound, refusedOK bool
	chainFound, ruleOK      bool // ruleOK: the chain is right and holds exactly our rules
	elems                   addrSet
	refused                 []netip.Addr // sorted
	dropped                 uint64
}

// read reads one family's set, its elements, chain and rule (right if it
// drops for port).
func read(ns netns.NsHandle, timeout time.Duration, s famSpec, port uint16) (kernelState, error) {
	k := kernelState{elems: addrSet{}}
	c, err := dial(ns, timeout)
	if err != nil {
		return k, err
	}
	tables, err := c.ListTablesOfFamily(ourTable.Family)
	if err != nil {
		return k, fmt.Errorf("list nftables tables in netns %s: %w", ns, err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == ourTable.Name })
	if i < 0 {
		return k, nil
	}
	table := tables[i]
	sets, err := c.GetSets(table)
	if err != nil {
		return k, fmt.Errorf("list sets of %s in netns %s: %w", desc, ns, err)
	}
	for _, set := range sets {
		if set.Name == s.refused {
			k.refusedFound, k.refusedOK = true, refusedRight(set, s)
			if k.refusedOK {
				if k.refused, err = readRefused(ns, timeout, s); err != nil {
					return k, err
				}
			}
			continue
		}
		if set.Name != s.set {
			continue
		}
		k.setFound, k.setOK = true, setRight(set, s)
		if !k.setOK {
			break
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return k, fmt.Errorf("list set %s of %s in netns %s: %w", s.set, desc, ns, err)
		}
		for _, e := range elems {
			if a, ok := s.addrOf(e.Key); ok {
				k.elems[a] = 0
			}
		}
	}
	chains, err := c.ListChainsOfTableFamily(ourTable.Family)
	if err != nil {
		return k, fmt.Errorf("list nftables chains in netns %s: %w", ns, err)
	}
	want := s.newChain(table)
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != ourTable.Name || ch.Name != s.chain {
			continue
		}
		k.chainFound = true
		if !chainRight(ch, want) {
			break
		}
		rules, err := c.GetRules(table, ch)
		if err != nil {
			return k, fmt.Errorf("list the rules of chain %s of %s in netns %s: %w", s.chain, desc, ns, err)
		}
		if len(rules) == 2 {
			k.dropped, _ = counterOf(rules[1])
		}
		k.ruleOK = rulesRight(rules, table, s, port)
	}
	return k, nil
}

// conn returns a fresh nftables connection into the Gate's namespace.
func (g *Gate) conn() (*nftables.Conn, error) { return dial(g.ns, g.timeout) }

func dial(ns netns.NsHandle, timeout time.Duration) (*nftables.Conn, error) {
	deadline := func(c *netlink.Conn) error { return c.SetDeadline(time.Now().Add(timeout)) }
	c, err := nftables.New(nftables.WithNetNSFd(nsFd(ns)), nftables.WithSockOptions(deadline))
	if err != nil {
		return nil, fmt.Errorf("nftables netlink in netns %s: %w", ns, err)
	}
	return c, nil
}

// nsFd is the descriptor to dial netlink into ns with: 0 ("where the
// calling thread is") when ns is closed or the thread is in it already
// (entering a namespace takes CAP_SYS_ADMIN, even one's own, which a pod
// granted NET_ADMIN alone lacks), else ns's.
func nsFd(ns netns.NsHandle) int {
	if !ns.IsOpen() {
		return 0
	}
	cur, err := netns.Get()
	if err != nil {
		return int(ns)
	}
	defer cur.Close()
	if cur.Equal(ns) {
		return 0
	}
	return int(ns)
}

// Probe checks that the kernel of namespace ns (a closed handle: the
// calling thread's) can run the guard, changing nothing: it sends one
// transaction that adds a table with both families' sets, chains and
// rules and deletes it again, so the kernel checks every expression the
// guard uses (fib, set lookup, dynamic set update) and nothing of it ever
// takes effect. The daemon calls it at start, before it claims a lease.
func Probe(ns netns.NsHandle) error {
	c, err := dial(ns, DefaultTimeout)
	if err != nil {
		return err
	}
	table := &nftables.Table{Family: ourTable.Family, Name: TableName + "-probe"}
	c.AddTable(table)
	for _, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		s := specOf(fam)
		set, refused := s.newSet(table), s.newRefusedSet(table)
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("probe nftables: add set %s: %w", s.set, err)
		}
		if err := c.AddSet(refused, nil); err != nil {
			return fmt.Errorf("probe nftables: add set %s: %w", s.refused, err)
		}
		chain := c.AddChain(s.newChain(table))
		c.AddRule(s.newRecordRule(table, chain, 4789, set.ID, refused.ID))
		c.AddRule(s.newRule(table, chain, 4789, set.ID))
	}
	c.DelTable(table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("probe nftables in netns %s (a test table in family inet, added and deleted in one transaction) failed: %w; %s", ns, err, needs)
	}
	return nil
}
