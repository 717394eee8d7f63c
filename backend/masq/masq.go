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

// Masq keeps table ip overlay in one network namespace equal to the rules for
// one cluster network. Its methods are safe for concurrent use.
type Masq struct {
	network netip.Prefix
	device  string
	ns      netns.NsHandle // owned: closed by Close
	timeout time.Duration
	log     *slog.Logger
	desired *state

	mu      sync.Mutex
	closed  bool
	batches int // write batches sent to the kernel, for tests
}

// Option configures New.
type Option func(*options) error

type options struct {
	ns      netns.NsHandle
	nsSet   bool
	device  string
	timeout time.Duration
	log     *slog.Logger
}

// WithNetNS programs the network namespace ns instead of the one the calling
// thread of New is in. Masq keeps its own duplicate of the handle; the
// caller may close ns.
func WithNetNS(ns netns.NsHandle) Option {
	return func(o *options) error {
		if !ns.IsOpen() {
			return fmt.Errorf("network namespace handle %d is not open: %w", int(ns), ErrInvalidConfig)
		}
		o.ns, o.nsSet = ns, true
		return nil
	}
}

// WithOverlayDevice names the VXLAN device (e.g. "overlay.1") and adds the
// rule that masquerades traffic from outside the cluster network leaving
// through it to pods on other hosts (see the package documentation).
func WithOverlayDevice(name string) Option {
	return func(o *options) error {
		if err := validDeviceName(name); err != nil {
			return fmt.Errorf("overlay device: %w: %w", err, ErrInvalidConfig)
		}
		o.device = name
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

// WithLogger sets the logger Run reports through (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		o.log = l
		return nil
	}
}

// New returns a Masq for network, an IPv4 prefix such as 10.244.0.0/16 (host
// bits are ignored). It touches nothing in the kernel: call Ensure.
func New(network netip.Prefix, opts ...Option) (*Masq, error) {
	if !network.IsValid() || !network.Addr().Is4() || network.Bits() == 0 {
		return nil, fmt.Errorf("cluster network %v: want an IPv4 prefix such as 10.244.0.0/16: %w", network, ErrInvalidConfig)
	}
	o := options{timeout: DefaultTimeout, log: slog.Default()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
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
	network = network.Masked()
	return &Masq{
		network: network,
		device:  o.device,
		ns:      ns,
		timeout: o.timeout,
		log:     o.log,
		desired: desiredState(network, o.device),
	}, nil
}

// Network returns the cluster network the rules are for.
func (m *Masq) Network() netip.Prefix { return m.network }

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
	c, err := nftables.New(nftables.WithNetNSFd(int(m.ns)), nftables.WithSockOptions(deadline))
	if err != nil {
		return nil, fmt.Errorf("nftables netlink in netns %s: %w", m.ns, err)
	}
	return c, nil
}

// Ensure makes the kernel hold exactly the desired table, and reports whether
// it had to write. It reads the table back and compares renderings; only if
// they differ does it replace the whole table in one atomic batch, and then
// it reads back again to verify.
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
	want := render(m.desired)
	if slices.Equal(render(cur), want) {
		return false, nil
	}
	if err := m.write(); err != nil {
		return false, err
	}
	after, err := m.read()
	if err != nil {
		return true, fmt.Errorf("verify table ip %s after writing it: %w", TableName, err)
	}
	if got := render(after); !slices.Equal(got, want) {
		return true, fmt.Errorf("table ip %s in netns %s differs from what was just written:\n--- want\n%s\n--- kernel\n%s",
			TableName, m.ns, strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	return true, nil
}

// write replaces the table in one batch, one nftables transaction: create
// the table if absent (so the delete cannot fail), delete it with whatever
// it holds, and add it back with our chains and rules.
func (m *Masq) write() error {
	c, err := m.conn()
	if err != nil {
		return err
	}
	d := m.desired
	c.AddTable(d.table)
	c.DelTable(d.table)
	c.AddTable(d.table)
	for _, ch := range d.chains {
		c.AddChain(ch.chain)
	}
	for _, ch := range d.chains {
		for _, r := range ch.rules {
			c.AddRule(r)
		}
	}
	m.batches++
	if err := c.Flush(); err != nil {
		err = fmt.Errorf("install table ip %s in netns %s: %w", TableName, m.ns, err)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			err = fmt.Errorf("%w (the kernel lacks an nf_tables feature: it needs CONFIG_NF_TABLES_IPV4, CONFIG_NFT_NAT and CONFIG_NFT_MASQ, built in or loadable)", err)
		}
		return err
	}
	return nil
}

// Remove deletes our table and everything in it. A missing table is success.
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
	c.DelTable(m.desired.table)
	m.batches++
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete table ip %s in netns %s: %w", TableName, m.ns, err)
	}
	return nil
}

// Rules renders what the kernel holds in our table, in `nft list table`
// syntax, one line per element (nil if the table does not exist). For tests
// and `overlayd status`.
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
	return render(st), nil
}

// ForwardDrops lists the nftables base chains of other tables, in families ip
// and inet, that hook forward with policy drop, as "family table chain". Our
// table has no forward chain, and no accept of ours could override such a
// drop anyway (see the package documentation): pod traffic is forwarded only
// if that chain accepts it itself. A hint, not a proof: a drop rule in a
// policy-accept chain is not reported, and legacy (non-nftables) iptables is
// invisible here.
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
	var drops []string
	for _, ch := range chains {
		if ch.Table == nil || ch.Hooknum == nil || ch.Policy == nil ||
			*ch.Hooknum != *nftables.ChainHookForward || *ch.Policy != nftables.ChainPolicyDrop ||
			ch.Table.Family != nftables.TableFamilyIPv4 && ch.Table.Family != nftables.TableFamilyINet ||
			ch.Table.Family == nftables.TableFamilyIPv4 && ch.Table.Name == TableName {
			continue
		}
		drops = append(drops, familyName(ch.Table.Family)+" "+ch.Table.Name+" "+ch.Name)
	}
	slices.Sort(drops)
	return drops, nil
}

// read returns what the kernel holds in our table (nil if it does not
// exist). Dumps are not atomic: the ruleset generation is read before and
// after, and a read that raced another writer is retried.
func (m *Masq) read() (*state, error) {
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
	return nil, fmt.Errorf("read table ip %s in netns %s: the ruleset kept changing, giving up after %d attempts: %w",
		TableName, m.ns, readAttempts, lastErr)
}

func (m *Masq) readOnce() (*state, error) {
	c, err := m.conn()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables in netns %s: %w", m.ns, err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == TableName })
	if i < 0 {
		return nil, nil
	}
	table := tables[i]
	// github.com/google/nftables v0.3.0 decodes these two big-endian
	// attributes in host byte order; undo that.
	table.Use, table.Flags = fromBigEndian(table.Use), fromBigEndian(table.Flags)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables chains in netns %s: %w", m.ns, err)
	}
	st := &state{table: table}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		ch.Table = table
		rules, err := c.GetRules(table, ch)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s in table ip %s in netns %s: %w", ch.Name, TableName, m.ns, err)
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
			m.log.Warn("masquerade rules: ensure failed; retrying", "network", m.network, "error", err)
			failing = true
		case err != nil:
			m.log.Debug("masquerade rules: ensure failed again", "network", m.network, "error", err)
		case failing:
			m.log.Info("masquerade rules: back in sync", "network", m.network, "changed", changed)
			failing = false
		case changed && first:
			m.log.Info("masquerade rules: installed", "network", m.network, "table", "ip "+TableName)
		case changed:
			m.log.Info("masquerade rules: repaired drift", "network", m.network, "table", "ip "+TableName)
		}
		if err == nil {
			first = false
		}
		timer.Reset(jitter.Spread(interval))
	}
}
