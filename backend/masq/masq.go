package masq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/lib/jitter"
)

var (
	// ErrInvalidConfig is returned by New for a network or option it cannot use.
	ErrInvalidConfig = errors.New("invalid masquerade configuration")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("masquerade manager is closed")
)

// DefaultTimeout bounds each netlink operation (one dump or one batch).
const DefaultTimeout = 10 * time.Second

// readAttempts bounds the retries of a read-back that raced another writer.
const readAttempts = 5

// ourTableDesc names our table in messages.
const ourTableDesc = "table inet " + TableName

// Masq keeps table inet overlay in one network namespace equal to the rules
// for the cluster networks, one per address family. Its methods are safe for
// concurrent use.
type Masq struct {
	clusters []cluster      // IPv4 first
	ns       netns.NsHandle // owned: closed by Close
	timeout  time.Duration
	log      *slog.Logger
	desired  *state

	mu      sync.Mutex
	closed  bool
	batches int // write batches sent to the kernel, for tests
}

// Network is a cluster network and the VXLAN device that carries it on
// this host ("" for none).
type Network struct {
	Prefix netip.Prefix
	Device string
}

// NewNetworks is New for a list of cluster networks, at most one per
// address family, each with its device.
func NewNetworks(nets []Network, opts ...Option) (*Masq, error) {
	if len(nets) == 0 {
		return nil, fmt.Errorf("%w: no cluster network", ErrInvalidConfig)
	}
	for i, n := range nets {
		if i > 0 {
			opts = append(opts, WithNetwork(n.Prefix))
		}
		if n.Device == "" {
			continue
		}
		if n.Prefix.Addr().Is4() {
			opts = append(opts, WithOverlayDevice(n.Device))
		} else {
			opts = append(opts, WithIPv6OverlayDevice(n.Device))
		}
	}
	return New(nets[0].Prefix, opts...)
}

// New returns a Masq for the cluster network, an IPv4 prefix such as
// 10.244.0.0/16 or an IPv6 one such as fd00:10:244::/48 (host bits are
// ignored); WithNetwork adds the other family's. It touches nothing in the
// kernel: call Ensure.
func New(network netip.Prefix, opts ...Option) (*Masq, error) {
	o := options{timeout: DefaultTimeout, log: slog.Default()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	clusters, err := clustersOf(append([]netip.Prefix{network}, o.networks...), o.device4, o.device6)
	if err != nil {
		return nil, err
	}
	var ns netns.NsHandle
	if o.nsSet {
		// A descriptor of our own (never 0..2): the caller may close theirs.
		fd, err := unix.FcntlInt(uintptr(o.ns), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return nil, fmt.Errorf("duplicate network namespace handle %d: %w", int(o.ns), err)
		}
		ns = netns.NsHandle(fd)
	} else {
		var err error
		if ns, err = netns.Get(); err != nil {
			return nil, fmt.Errorf("open the current network namespace: %w", err)
		}
	}
	return &Masq{
		clusters: clusters,
		ns:       ns,
		timeout:  o.timeout,
		log:      o.log,
		desired:  desiredState(clusters),
	}, nil
}

// clustersOf checks the cluster networks (at most one per family) and pairs
// each with its family's overlay device, IPv4 first.
func clustersOf(networks []netip.Prefix, device4, device6 string) ([]cluster, error) {
	var v4, v6 cluster
	for _, p := range networks {
		if err := validNetwork(p); err != nil {
			return nil, fmt.Errorf("cluster network %v: %w: %w", p, err, ErrInvalidConfig)
		}
		c, fam := &v4, "IPv4"
		if p.Addr().Is6() {
			c, fam = &v6, "IPv6"
		}
		if c.network.IsValid() {
			return nil, fmt.Errorf("two %s cluster networks, %v and %v: want at most one per address family: %w",
				fam, c.network, p, ErrInvalidConfig)
		}
		c.network = p.Masked()
	}
	for _, d := range []struct {
		c      *cluster
		device string
		fam    string
	}{{&v4, device4, "IPv4"}, {&v6, device6, "IPv6"}} {
		if d.device != "" && !d.c.network.IsValid() {
			return nil, fmt.Errorf("overlay device %q is for the %s cluster network, and there is none: %w",
				d.device, d.fam, ErrInvalidConfig)
		}
		d.c.device = d.device
	}
	var out []cluster
	for _, c := range []cluster{v4, v6} {
		if c.network.IsValid() {
			out = append(out, c)
		}
	}
	return out, nil
}

// validNetwork reports why p cannot be a cluster network, or nil.
func validNetwork(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return errors.New("want an IPv4 prefix such as 10.244.0.0/16 or an IPv6 one such as fd00:10:244::/48")
	case p.Addr().Is4In6():
		return errors.New("an IPv4-mapped IPv6 prefix: write the IPv4 prefix itself")
	case p.Bits() == 0:
		return errors.New("the whole address space would masquerade everything")
	}
	return nil
}

// Networks returns the cluster networks the rules are for, IPv4 first.
func (m *Masq) Networks() []netip.Prefix {
	out := make([]netip.Prefix, len(m.clusters))
	for i, c := range m.clusters {
		out[i] = c.network
	}
	return out
}

// Close releases the namespace handle. It leaves the rules in place (a
// restarting daemon must not open a window without NAT); Remove deletes
// them. Safe to call twice.
func (m *Masq) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.ns.Close()
}

// conn returns a fresh nftables connection into our namespace. Each operation
// dials its own socket, bounded by m.timeout, and a failed batch leaves no
// state behind in a long-lived Conn.
func (m *Masq) conn() (*nftables.Conn, error) {
	deadline := func(c *netlink.Conn) error { return c.SetDeadline(time.Now().Add(m.timeout)) }
	c, err := nftables.New(nftables.WithNetNSFd(nsFd(m.ns)), nftables.WithSockOptions(deadline))
	if err != nil {
		return nil, fmt.Errorf("nftables netlink in netns %s: %w", m.ns, err)
	}
	return c, nil
}

// Ensure makes the kernel hold exactly the desired table, and reports whether
// it had to write. It reads our tables back and compares renderings; only if
// they differ does it replace the whole table (and delete the ip-family
// table of older versions) in one atomic batch, and then it reads back again
// to verify.
func (m *Masq) Ensure() (changed bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, ErrClosed
	}
	cur, err := m.read()
	if err != nil {
		return false, err
	}
	want := renderAll([]*state{m.desired})
	if slices.Equal(renderAll(cur), want) {
		return false, nil
	}
	if err := m.write(); err != nil {
		return false, err
	}
	after, err := m.read()
	if err != nil {
		return true, fmt.Errorf("verify %s after writing it: %w", ourTableDesc, err)
	}
	if got := renderAll(after); !slices.Equal(got, want) {
		return true, fmt.Errorf("%s in netns %s differs from what was just written:\n--- want\n%s\n--- kernel\n%s",
			ourTableDesc, m.ns, strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	return true, nil
}

// write replaces our table in one batch, one nftables transaction: delete
// it with whatever it holds and add it back with our chain and rules, and
// delete the ip-family table of older versions. A host upgraded from such a
// version goes from the old rules to the new ones at once: no packet leaves
// between the two un-NATed. If the kernel rejects any part (one without
// family inet NAT), it applies none, and the old table keeps working.
func (m *Masq) write() error {
	c, err := m.conn()
	if err != nil {
		return err
	}
	d := m.desired
	deleteTable(c, ourTable)
	c.AddTable(d.table)
	for _, ch := range d.chains {
		c.AddChain(ch.chain)
	}
	for _, ch := range d.chains {
		for _, r := range ch.rules {
			c.AddRule(r)
		}
	}
	deleteTable(c, legacyTable)
	m.batches++
	if err := c.Flush(); err != nil {
		err = fmt.Errorf("install %s in netns %s: %w", ourTableDesc, m.ns, err)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT) {
			err = fmt.Errorf("%w (%s)", err, kernelHint(kernelRelease()))
		}
		return err
	}
	return nil
}

// deleteTable queues the deletion of t with everything in it. It queues its
// creation first, so the delete cannot fail when t does not exist.
func deleteTable(c *nftables.Conn, t nftables.Table) {
	c.AddTable(&t)
	c.DelTable(&t)
}

// Remove deletes our table, and the ip-family table of older versions, with
// everything in them. Missing tables are success.
func (m *Masq) Remove() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	c, err := m.conn()
	if err != nil {
		return err
	}
	deleteTable(c, ourTable)
	deleteTable(c, legacyTable)
	m.batches++
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete %s in netns %s: %w", ourTableDesc, m.ns, err)
	}
	return nil
}

// Rules renders what the kernel holds in our table, in `nft list table`
// syntax, one line per element, followed by the ip-family table of older
// versions if it exists (nil if neither does). For tests and `overlayd
// status`.
func (m *Masq) Rules() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	st, err := m.read()
	if err != nil {
		return nil, err
	}
	return renderAll(st), nil
}

// ForwardDrops lists the nftables base chains of other tables that hook
// forward with policy drop and see the cluster's traffic — families inet and,
// for the cluster's address families, ip and ip6 — as "family table chain".
// Our table has no forward chain, and no accept of ours could override such
// a drop anyway (see the package documentation): pod traffic is forwarded
// only if that chain accepts it itself. The ip-family table of older
// versions is not ours any more: a drop chain in it is reported too. A hint,
// not a proof: a drop rule in a policy-accept chain is not reported, and
// legacy (non-nftables) iptables is invisible here.
func (m *Masq) ForwardDrops() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	c, err := m.conn()
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		return nil, fmt.Errorf("list nftables chains in netns %s: %w", m.ns, err)
	}
	families := map[nftables.TableFamily]bool{nftables.TableFamilyINet: true}
	for _, cl := range m.clusters {
		families[familyOf(cl.network).table] = true
	}
	var drops []string
	for _, ch := range chains {
		if ch.Table == nil || ch.Hooknum == nil || ch.Policy == nil ||
			*ch.Hooknum != *nftables.ChainHookForward || *ch.Policy != nftables.ChainPolicyDrop ||
			!families[ch.Table.Family] || isTable(ch.Table, ourTable) {
			continue
		}
		drops = append(drops, FamilyName(ch.Table.Family)+" "+ch.Table.Name+" "+ch.Name)
	}
	slices.Sort(drops)
	return drops, nil
}

func isTable(t *nftables.Table, want nftables.Table) bool {
	return t.Family == want.Family && t.Name == want.Name
}

// read returns what the kernel holds in our table and in the ip-family
// table of older versions, those that exist, in that order. Dumps are not
// atomic: the ruleset generation is read before and after, and a read that
// raced another writer is retried.
func (m *Masq) read() ([]*state, error) {
	var lastErr error
	for range readAttempts {
		before, err := generation(m.ns, m.timeout)
		if err != nil {
			return nil, err
		}
		st, err := m.readOnce()
		after, gerr := generation(m.ns, m.timeout)
		if gerr != nil {
			return nil, gerr
		}
		if before == after {
			return st, err
		}
		lastErr = fmt.Errorf("ruleset generation changed from %d to %d while reading", before, after)
		if err != nil {
			lastErr = fmt.Errorf("%w: %w", lastErr, err)
		}
	}
	return nil, fmt.Errorf("read %s in netns %s: the ruleset kept changing, giving up after %d attempts: %w",
		ourTableDesc, m.ns, readAttempts, lastErr)
}

func (m *Masq) readOnce() ([]*state, error) {
	c, err := m.conn()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables in netns %s: %w", m.ns, err)
	}
	var out []*state
	for _, want := range []nftables.Table{ourTable, legacyTable} {
		i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return isTable(t, want) })
		if i < 0 {
			continue
		}
		st, err := readTable(c, tables[i])
		if err != nil {
			return nil, fmt.Errorf("%w in netns %s", err, m.ns)
		}
		out = append(out, st)
	}
	return out, nil
}

// readTable returns table with its chains and their rules.
func readTable(c *nftables.Conn, table *nftables.Table) (*state, error) {
	// github.com/google/nftables v0.3.0 decodes these two big-endian
	// attributes in host byte order; undo that.
	table.Use, table.Flags = fromBigEndian(table.Use), fromBigEndian(table.Flags)
	// Only the table's family: the kernel cannot filter the dump by table,
	// and other families may hold thousands of chains (kube-proxy's).
	chains, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return nil, fmt.Errorf("list nftables chains of family %s: %w", FamilyName(table.Family), err)
	}
	st := &state{table: table}
	for _, ch := range chains {
		if ch.Table == nil || !isTable(ch.Table, *table) {
			continue
		}
		ch.Table = table
		rules, err := c.GetRules(table, ch)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s in table %s %s: %w", ch.Name, FamilyName(table.Family), table.Name, err)
		}
		st.chains = append(st.chains, chainState{chain: ch, rules: rules})
	}
	return st, nil
}

// fromBigEndian reinterprets v, decoded in host byte order, as big endian.
func fromBigEndian(v uint32) uint32 {
	return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, v))
}

// Run calls Ensure now and then every interval (±10 % jitter) until ctx is
// done, then returns nil (or ErrClosed if m is closed under it). report, if
// not nil, is called after every Ensure, from Run's goroutine, with its
// result (for metrics and readiness). Logs are quiet: the first failure of a
// streak, the return to sync, and repairs.
func (m *Masq) Run(ctx context.Context, interval time.Duration, report func(changed bool, err error)) error {
	if interval <= 0 {
		return fmt.Errorf("re-apply interval %v is not positive: %w", interval, ErrInvalidConfig)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	failing, first := false, true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		changed, err := m.Ensure()
		if report != nil {
			report(changed, err)
		}
		switch {
		case errors.Is(err, ErrClosed):
			return err
		case err != nil && !failing:
			m.log.Warn("masquerade rules: ensure failed; retrying", "networks", m.Networks(), "error", err)
			failing = true
		case err != nil:
			m.log.Debug("masquerade rules: ensure failed again", "networks", m.Networks(), "error", err)
		case failing:
			m.log.Info("masquerade rules: back in sync", "networks", m.Networks(), "changed", changed)
			failing = false
		case changed && first:
			m.log.Info("masquerade rules: installed", "networks", m.Networks(), "table", "inet "+TableName)
		case changed:
			m.log.Info("masquerade rules: repaired drift", "networks", m.Networks(), "table", "inet "+TableName)
		}
		if err == nil {
			first = false
		}
		timer.Reset(jitter.Spread(interval))
	}
}
