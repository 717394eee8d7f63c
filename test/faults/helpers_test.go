package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Continuous traffic: 20 probes a second over UDP, which never
// retransmits, so a probe whose echo does not come back was dropped. The
// timeout is generous because the echoes are read by this test process,
// which under -race on a busy 2-core machine can stall for seconds: a late
// echo is not a drop.
var (
	streamInterval = 50 * time.Millisecond
	streamTimeout  = testenv.Deadline(5 * time.Second)
)

// seed returns the seed for a test: OVERLAY_FAULT_SEED if set (to replay a
// failure), else a fresh one. It is printed either way.
func seed(t *testing.T) uint64 {
	t.Helper()
	s := rand.Uint64()
	if v := os.Getenv("OVERLAY_FAULT_SEED"); v != "" {
		if _, err := fmt.Sscan(v, &s); err != nil {
			t.Fatalf("OVERLAY_FAULT_SEED=%q: %v", v, err)
		}
	}
	t.Logf("seed %d (replay with OVERLAY_FAULT_SEED=%d)", s, s)
	return s
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(d))
	t.Cleanup(cancel)
	return ctx
}

func newClient(t *testing.T, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// fleet is the test's model of the fake peers it writes to etcd: leases of
// hosts that do not exist, with public IPs in 198.19.0.0/16 (routed
// nowhere in the lab: no packet is ever sent towards them).
type fleet struct {
	reg    *etcdv3.Registry
	rng    *rand.Rand
	subnet func(i int) netip.Prefix
	next   int                                // next index to add
	gen    int                                // bumped for each change
	leases map[netip.Prefix]subnet.LeaseAttrs // what etcd must hold
	index  map[netip.Prefix]int
	avoid  map[netip.Prefix]bool // the real hosts' subnets
	// counts of the writes made, for the report
	added, removed, changed int
}

func newFleet(reg *etcdv3.Registry, rng *rand.Rand, subnetOf func(int) netip.Prefix) *fleet {
	return &fleet{reg: reg, rng: rng, subnet: subnetOf, leases: map[netip.Prefix]subnet.LeaseAttrs{}, index: map[netip.Prefix]int{}, avoid: map[netip.Prefix]bool{}}
}

func (f *fleet) attrs(i, gen int) subnet.LeaseAttrs {
	ip := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	if gen%2 == 1 { // every other generation moves the peer to another address
		ip = netip.AddrFrom4([4]byte{198, 19, 200 + byte(i>>8)%50, byte(i)})
	}
	mac := net.HardwareAddr{0x0e, 0xfa, byte(gen >> 8), byte(gen), byte(i >> 8), byte(i)}
	return subnet.NewAttrs(ip, subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(mac), fmt.Sprintf("fake-%d", i), "")
}

// put writes one lease, retrying through a failover (bounded).
func (f *fleet) put(ctx context.Context, p netip.Prefix, a subnet.LeaseAttrs) error {
	val, err := a.Marshal()
	if err != nil {
		return err
	}
	return retryWrite(ctx, func(ctx context.Context) error {
		_, err := f.reg.Client().Put(ctx, f.reg.Keys.LeaseKey(subnet.Subnets{IPv4: p}), string(val))
		return err
	})
}

func (f *fleet) del(ctx context.Context, p netip.Prefix) error {
	return retryWrite(ctx, func(ctx context.Context) error {
		_, err := f.reg.Client().Delete(ctx, f.reg.Keys.LeaseKey(subnet.Subnets{IPv4: p}))
		return err
	})
}

func retryWrite(ctx context.Context, op func(context.Context) error) error {
	var err error
	for range 20 {
		rctx, cancel := context.WithTimeout(ctx, testenv.Deadline(3*time.Second))
		err = op(rctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return err
}

// add creates n new fake leases.
func (f *fleet) add(ctx context.Context, n int) error {
	for range n {
		for f.avoid[f.subnet(f.next)] {
			f.next++
		}
		i := f.next
		f.next++
		p := f.subnet(i)
		a := f.attrs(i, 0)
		if err := f.put(ctx, p, a); err != nil {
			return fmt.Errorf("add %s: %w", p, err)
		}
		f.leases[p], f.index[p] = a, i
		f.added++
	}
	return nil
}

func (f *fleet) pick() netip.Prefix {
	keys := make([]netip.Prefix, 0, len(f.leases))
	for p := range f.leases {
		keys = append(keys, p)
	}
	slices.SortFunc(keys, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return keys[f.rng.IntN(len(keys))]
}

// remove deletes n random fake leases.
func (f *fleet) remove(ctx context.Context, n int) error {
	for range min(n, len(f.leases)) {
		p := f.pick()
		if err := f.del(ctx, p); err != nil {
			return fmt.Errorf("remove %s: %w", p, err)
		}
		delete(f.leases, p)
		delete(f.index, p)
		f.removed++
	}
	return nil
}

// change gives n random fake leases a new VTEP MAC and, every other time,
// a new public IP.
func (f *fleet) change(ctx context.Context, n int) error {
	for range min(n, len(f.leases)) {
		p := f.pick()
		f.gen++
		a := f.attrs(f.index[p], f.gen)
		if err := f.put(ctx, p, a); err != nil {
			return fmt.Errorf("change %s: %w", p, err)
		}
		f.leases[p] = a
		f.changed++
	}
	return nil
}

// churn removes, changes and adds between 1 and n leases each, at random,
// and returns how many of each.
func (f *fleet) churn(ctx context.Context, n int) (churned, error) {
	return f.apply(ctx, f.draw(n))
}

// draw picks how many leases a churn of up to n each removes, changes and
// adds.
func (f *fleet) draw(n int) churned {
	return churned{Removed: f.rng.IntN(n) + 1, Changed: f.rng.IntN(n) + 1, Added: f.rng.IntN(n) + 1}
}

// apply removes, changes and adds as many leases as c says.
func (f *fleet) apply(ctx context.Context, c churned) (churned, error) {
	if err := f.remove(ctx, c.Removed); err != nil {
		return c, err
	}
	if err := f.change(ctx, c.Changed); err != nil {
		return c, err
	}
	if err := f.add(ctx, c.Added); err != nil {
		return c, err
	}
	c.Total = len(f.leases)
	return c, nil
}

type churned struct{ Added, Removed, Changed, Total int }

func (c churned) String() string {
	return fmt.Sprintf("+%d -%d ~%d (now %d fake peers)", c.Added, c.Removed, c.Changed, c.Total)
}

// writes is about how many kernel writes applying c takes.
func (c churned) writes() int { return 3 * (c.Added + c.Removed + c.Changed) }

// leaseSet is every lease in etcd (reg's view), checked against the model:
// every fake lease written must be there, as written, and no other.
func (f *fleet) leaseSet(ctx context.Context, hosts map[string]bool) (map[netip.Prefix]subnet.Lease, error) {
	var snap subnet.Snapshot
	err := retryWrite(ctx, func(ctx context.Context) (err error) {
		snap, err = f.reg.List(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(snap.Invalid) > 0 {
		return nil, fmt.Errorf("etcd holds %d invalid leases: %+v", len(snap.Invalid), snap.Invalid)
	}
	set := make(map[netip.Prefix]subnet.Lease, len(snap.Leases))
	var errs []error
	for _, l := range snap.Leases {
		set[l.Subnet] = l
		if hosts[l.Attrs.NodeID] {
			continue
		}
		want, ok := f.leases[l.Subnet]
		if !ok {
			errs = append(errs, fmt.Errorf("etcd holds %s (%s), which the test removed", l.Subnet, l.Attrs.NodeID))
		} else if !subnet.SameAttrs(want, l.Attrs) {
			errs = append(errs, fmt.Errorf("etcd holds %s as %+v, the test wrote %+v", l.Subnet, l.Attrs, want))
		}
	}
	for p := range f.leases {
		if _, ok := set[p]; !ok {
			errs = append(errs, fmt.Errorf("etcd lost the lease %s", p))
		}
	}
	return set, errors.Join(errs...)
}

// expectedKernel renders what a host whose own subnet is own must hold for
// the lease set, in vxlantest.State's format: per peer a route, a permanent
// neighbour and an FDB entry on overlay.1.
func expectedKernel(set map[netip.Prefix]subnet.Lease, own netip.Prefix) ([]string, error) {
	var lines []string
	for p, l := range set {
		if p == own {
			continue
		}
		d, err := leasedata.DecodeLeaseData("BackendData", l.Attrs.BackendData)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", p, err)
		}
		mac, err := net.ParseMAC(d.VtepMAC)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", p, err)
		}
		gw := p.Addr()
		lines = append(lines,
			fmt.Sprintf("route %s via %s dev overlay.1 onlink", p, gw),
			fmt.Sprintf("neigh %s lladdr %s dev overlay.1", gw, mac),
			fmt.Sprintf("fdb %s dst %s dev overlay.1", mac, l.Attrs.PublicIP))
	}
	slices.Sort(lines)
	return lines, nil
}

var kernelMu sync.Mutex

// kernelEntries renders a host's routes, permanent neighbours and FDB
// entries of overlay.1, sorted (vxlantest.State on the real kernel).
func kernelEntries(n *lab.Node) ([]string, error) {
	// One reader at a time: the tests run in parallel, and vxlan's raw
	// netlink sockets share their destination address (see faults.md).
	kernelMu.Lock()
	defer kernelMu.Unlock()
	nl, err := vxlan.OpenNetlink(n.NS)
	if err != nil {
		return nil, err
	}
	defer nl.Close()
	var text string
	for range 5 { // a dump interrupted by a concurrent change is retried
		if text, err = vxlantest.State(nl, "overlay.1"); err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if strings.HasPrefix(l, "route ") || strings.HasPrefix(l, "neigh ") || strings.HasPrefix(l, "fdb ") {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines, nil
}

// kernelDiff compares a host's kernel with the lease set and returns nil if
// they are equal, else what is missing and what is stale.
func kernelDiff(n *lab.Node, set map[netip.Prefix]subnet.Lease) error {
	own, err := n.Lease()
	if err != nil {
		return err
	}
	want, err := expectedKernel(set, own)
	if err != nil {
		return err
	}
	got, err := kernelEntries(n)
	if err != nil {
		return err
	}
	if slices.Equal(got, want) {
		return nil
	}
	var missing, stale []string
	for _, l := range want {
		if _, ok := slices.BinarySearch(got, l); !ok {
			missing = append(missing, l)
		}
	}
	for _, l := range got {
		if _, ok := slices.BinarySearch(want, l); !ok {
			stale = append(stale, l)
		}
	}
	return fmt.Errorf("%s: kernel has %d entries, lease set wants %d: %d missing %s, %d stale %s",
		n.Name, len(got), len(want), len(missing), head(missing), len(stale), head(stale))
}

func head(lines []string) string {
	const show = 4
	if len(lines) > show {
		return fmt.Sprintf("%q...", lines[:show])
	}
	return fmt.Sprintf("%q", lines)
}

// converged waits until every node's kernel equals the lease set (polling:
// the watch and the reconciler are asynchronous) and returns how long it
// took.
func converged(t *testing.T, f *fleet, nodes []*lab.Node, timeout time.Duration) time.Duration {
	t.Helper()
	hosts := map[string]bool{}
	for _, n := range nodes {
		hosts[n.Name] = true
	}
	ctx := ctxT(t, timeout+30*time.Second)
	return labtest.Eventually(t, timeout, "every host's kernel to equal the lease set", func() error {
		set, err := f.leaseSet(ctx, hosts)
		if err != nil {
			t.Fatalf("etcd: %v", err) // the datastore lost or changed a write: no waiting fixes that
		}
		var errs []error
		for _, n := range nodes {
			errs = append(errs, kernelDiff(n, set))
		}
		return errors.Join(errs...)
	})
}

// hostLease is a host's lease as etcd holds it: it must survive every
// fault unchanged (same subnet, same etcd lease).
type hostLease struct {
	Subnet    netip.Prefix
	EtcdLease int64
}

func hostLeases(t *testing.T, f *fleet, nodes []*lab.Node) map[string]hostLease {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	var snap subnet.Snapshot
	if err := retryWrite(ctx, func(ctx context.Context) (err error) {
		snap, err = f.reg.List(ctx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	out := map[string]hostLease{}
	for _, n := range nodes {
		for _, l := range snap.Leases {
			if l.Attrs.NodeID == n.Name {
				out[n.Name] = hostLease{l.Subnet, l.EtcdLease}
			}
		}
		if _, ok := out[n.Name]; !ok {
			t.Fatalf("%s holds no lease in etcd", n.Name)
		}
	}
	return out
}

// readiness samples every node's /readyz twice a second and remembers each
// change, so a test can say when a fault was reported and when it cleared.
type readiness struct {
	mu      sync.Mutex
	state   map[string]bool
	changes []readyChange
	stop    chan struct{}
	wg      sync.WaitGroup
}

type readyChange struct {
	At     time.Time
	Node   string
	Ready  bool
	Reason string
}

func watchReadiness(nodes []*lab.Node) *readiness {
	r := &readiness{state: map[string]bool{}, stop: make(chan struct{})}
	for _, n := range nodes {
		r.state[n.Name] = true
	}
	r.wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, n := range nodes {
				// overlayd answers in microseconds; only a stalled
				// test process (-race, a busy machine) takes seconds.
				ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(5*time.Second))
				ok, body, err := n.Readyz(ctx)
				cancel()
				if err != nil {
					ok, body = false, "no answer: "+err.Error()
				}
				r.mu.Lock()
				if r.state[n.Name] != ok {
					r.state[n.Name] = ok
					r.changes = append(r.changes, readyChange{time.Now(), n.Name, ok, body})
				}
				r.mu.Unlock()
			}
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
		}
	})
	return r
}

func (r *readiness) close() {
	close(r.stop)
	r.wg.Wait()
}

// since returns the changes after t.
func (r *readiness) since(t time.Time) []readyChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []readyChange
	for _, c := range r.changes {
		if c.At.After(t) {
			out = append(out, c)
		}
	}
	return out
}

func (r *readiness) allReady() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ok := range r.state {
		if !ok {
			return false
		}
	}
	return true
}

func (r *readiness) ready(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state[node]
}

// streams runs a probe stream from every pod to the next host's pod.
type streams struct {
	names []string
	s     []*lab.Stream
}

func startStreams(t *testing.T, pods []*lab.Pod) *streams {
	t.Helper()
	ss := &streams{}
	for i, from := range pods {
		to := pods[(i+1)%len(pods)]
		s, err := lab.StartStream(from.NS, netip.AddrPortFrom(to.IP, lab.ProbePort), streamInterval, streamTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		ss.names = append(ss.names, fmt.Sprintf("%s -> %s", from, to))
		ss.s = append(ss.s, s)
	}
	labtest.Eventually(t, 5*streamInterval+testenv.Slack, "probe streams to start", func() error {
		for i, s := range ss.s {
			if st := s.Stats(); st.Received < 5 {
				return fmt.Errorf("%s: %s", ss.names[i], st)
			}
		}
		return nil
	})
	return ss
}

// lost returns an error naming the streams that lost probes so far.
func (ss *streams) lost() error {
	var errs []error
	for i, s := range ss.s {
		if st := s.Stats(); len(st.Lost) > 0 {
			errs = append(errs, fmt.Errorf("%s: %s", ss.names[i], st))
		}
	}
	return errors.Join(errs...)
}

// finish stops the streams and fails t if any probe was lost; it returns
// the totals.
func (ss *streams) finish(t *testing.T) (sent, lost int) {
	t.Helper()
	for i, s := range ss.s {
		st := s.Stop()
		t.Logf("%s: %s", ss.names[i], st)
		sent += st.Sent
		lost += len(st.Lost)
		if st.Sent == 0 || len(st.Lost) > 0 || st.Received != st.Sent {
			t.Errorf("%s: %s; want every probe answered", ss.names[i], st)
		}
	}
	return sent, lost
}

// logCount counts the lines of a host's overlayd log containing every one
// of the strings.
func logCount(t *testing.T, n *lab.Node, all ...string) int {
	t.Helper()
	data, err := os.ReadFile(n.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	for _, line := range strings.Split(string(data), "\n") {
		ok := true
		for _, s := range all {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			c++
		}
	}
	return c
}

// alive fails t if an overlayd exited.
func alive(t *testing.T, nodes []*lab.Node) {
	t.Helper()
	for _, n := range nodes {
		done, how := n.Exited()
		select {
		case <-done:
			t.Fatalf("overlayd on %s exited: %v (see %s)", n.Name, how(), n.LogFile)
		default:
		}
	}
}
