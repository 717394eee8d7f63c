package faults

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// crashNetwork has room for far more than 500 /24 subnets.
const crashNetwork = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`

// overlayd on h1 is killed with SIGKILL at random points while it converges
// 500 peers, 20 times (seeded). Even iterations change the lease set while
// overlayd runs and kill it midway through applying the watch events; odd
// ones change the lease set and the underlay MTU while it is down, start it
// and kill it midway through its first pass (or earlier: connecting,
// acquiring, creating the device, writing subnet.env). A kill point is a
// random number of kernel writes observed (route and neighbour/FDB
// notifications), or for a quarter of the kills a random moment after the
// start. After every restart, as soon as /readyz says ready, the kernel
// must hold exactly the lease set — no stale entry, none missing — with no
// polling. A reader running throughout must only ever see the old or the
// new complete subnet.env, and pod traffic between h1 and h2, whose leases
// never change, must not lose a packet.
func TestCrashConsistency(t *testing.T) {
	t.Parallel()
	const peers, iterations = 500, 20
	sd := seed(t)
	rng := rand.New(rand.NewPCG(sd, sd^0x6f766c))
	start := time.Now()
	l := labtest.New(t, lab.Config{NetworkConfig: crashNetwork})
	cli, err := l.Etcd.DirectClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	f := newFleet(etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix), rng, func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i>>8), byte(i), 0}), 24)
	})
	ctx := ctxT(t, 10*time.Minute)
	// The fake peers first: the hosts then pick subnets no fake one holds.
	if err := f.add(ctx, peers); err != nil {
		t.Fatal(err)
	}
	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	for _, hl := range hostLeases(t, f, nodes) {
		f.avoid[hl.Subnet] = true
	}
	took := converged(t, f, nodes, 60*time.Second)
	t.Logf("2 hosts converged on %d fake peers in %s", peers, took.Round(time.Millisecond))
	leases := hostLeases(t, f, nodes)
	ss := startStreams(t, []*lab.Pod{labtest.AddPod(t, h1, "p1"), labtest.AddPod(t, h2, "p1")})

	env := watchEnv(t, h1)
	defer env.close()

	var kills, restarts int
	for it := range iterations {
		var what string
		if it%2 == 0 {
			// Kill while applying watch events.
			k := newKiller(t, h1, rng)
			c := f.draw(60)
			writes := c.writes()
			var cerr error
			var wg sync.WaitGroup
			wg.Go(func() { c, cerr = f.apply(ctx, c) })
			// The events arrive as they are written; aim anywhere within
			// the kernel writes the churn causes.
			point := k.killWithin(t, writes, 0)
			wg.Wait()
			if cerr != nil {
				t.Fatal(cerr)
			}
			what = fmt.Sprintf("events %s, killed %s", c, point)
		} else {
			// Down: change the lease set and the underlay MTU, start, kill
			// during the first pass.
			if err := h1.Stop(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			kills++
			c, err := f.churn(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			mtu := 1400 + rng.IntN(101)
			env.expect(mtu - 50)
			setMTU(t, h1, mtu)
			k := newKiller(t, h1, rng)
			if err := h1.Start(); err != nil {
				t.Fatal(err)
			}
			restarts++
			point := k.killWithin(t, c.writes(), 400*time.Millisecond)
			what = fmt.Sprintf("down %s, underlay MTU %d, killed %s", c, mtu, point)
		}
		kills++
		if err := h1.Start(); err != nil {
			t.Fatal(err)
		}
		restarts++
		labtest.WaitReady(t, h1)
		// Ready means the first pass over the full lease set succeeded: the
		// kernel must be exact now, not eventually.
		set, err := f.leaseSet(ctx, map[string]bool{"h1": true, "h2": true})
		if err != nil {
			t.Fatalf("iteration %d: etcd: %v", it, err)
		}
		if err := kernelDiff(h1, set); err != nil {
			t.Fatalf("iteration %d (%s): ready, but %v", it, what, err)
		}
		env.settle(t)
		converged(t, f, nodes, 15*time.Second) // h2 follows by watch
		if err := ss.lost(); err != nil {
			t.Fatalf("iteration %d (%s): probes lost: %v", it, what, err)
		}
		t.Logf("iteration %d: %s; exact after restart (%d peers)", it, what, len(set)-1)
	}
	alive(t, nodes)
	if after := hostLeases(t, f, nodes); fmt.Sprint(after) != fmt.Sprint(leases) {
		t.Errorf("host leases changed: %v -> %v", leases, after)
	}
	sent, lost := ss.finish(t)
	reads, seen := env.close()
	tmp, _ := filepath.Glob(filepath.Join(filepath.Dir(h1.SubnetFile), "."+filepath.Base(h1.SubnetFile)+".tmp-*"))
	t.Logf("crash consistency: %d iterations, %d SIGKILLs, %d restarts, %d lease writes (+%d -%d ~%d), %d subnet.env reads (%d distinct complete files, 0 torn), %d leftover temporary files, %d probes sent, %d lost, %s",
		iterations, kills, restarts, f.added+f.removed+f.changed, f.added, f.removed, f.changed, reads, seen, len(tmp), sent, lost, time.Since(start).Round(time.Second))
}

// killer SIGKILLs a host's overlayd at a random point, counted in kernel
// writes it sees (route and neighbour/FDB notifications in the host's
// namespace) or, for some kills, a random time.
type killer struct {
	n      *lab.Node
	rng    *rand.Rand
	events chan struct{}
	done   chan struct{}
	start  time.Time
}

func newKiller(t *testing.T, n *lab.Node, rng *rand.Rand) *killer {
	t.Helper()
	// Its own generator, seeded from the test's: it draws while the test
	// writes leases with the other.
	k := &killer{n: n, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), events: make(chan struct{}, 1<<16), done: make(chan struct{}), start: time.Now()}
	routes := make(chan netlink.RouteUpdate, 4096)
	neighs := make(chan netlink.NeighUpdate, 4096)
	if err := netlink.RouteSubscribeAt(n.NS, routes, k.done); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighSubscribeAt(n.NS, neighs, k.done); err != nil {
		t.Fatal(err)
	}
	fwd := func() {
		select {
		case k.events <- struct{}{}:
		default:
		}
	}
	go func() {
		for range routes {
			fwd()
		}
	}()
	go func() {
		for range neighs {
			fwd()
		}
	}()
	return k
}

// killWithin kills after a random number of kernel writes up to about
// writes, or (with probability 1/4, when early > 0) at a random moment
// within early, and says which.
func (k *killer) killWithin(t *testing.T, writes int, early time.Duration) string {
	t.Helper()
	defer close(k.done)
	var point string
	if early > 0 && k.rng.IntN(4) == 0 {
		d := time.Duration(k.rng.Int64N(int64(early)))
		time.Sleep(time.Until(k.start.Add(d))) // the fault's timing, not a synchronisation
		point = fmt.Sprintf("%s after the start", d.Round(time.Millisecond))
	} else {
		want := 1 + k.rng.IntN(max(writes, 1))
		seen := 0
		deadline := time.After(5 * time.Second)
	wait:
		for seen < want {
			select {
			case <-k.events:
				seen++
			case <-deadline:
				break wait
			}
		}
		point = fmt.Sprintf("after %d of ~%d kernel writes", seen, writes)
	}
	if err := k.n.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return point
}

func setMTU(t *testing.T, n *lab.Node, mtu int) {
	t.Helper()
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(n.Iface)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetMTU(link, mtu); err != nil {
		t.Fatal(err)
	}
}

// envWatch reads a host's subnet.env in a tight loop and records anything
// that is not one of the complete files allowed at that moment.
type envWatch struct {
	path string
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	base    subnet.Env
	allowed map[int]bool // MTUs
	latest  int          // the MTU the file must have once settled
	reads   int
	seen    map[string]bool
	bad     []string
}

func watchEnv(t *testing.T, n *lab.Node) *envWatch {
	t.Helper()
	base, err := n.Env()
	if err != nil {
		t.Fatal(err)
	}
	w := &envWatch{path: n.SubnetFile, stop: make(chan struct{}), base: base, allowed: map[int]bool{base.MTU: true}, latest: base.MTU, seen: map[string]bool{}}
	w.wg.Go(func() {
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			w.check()
			time.Sleep(200 * time.Microsecond)
		}
	})
	return w
}

func (w *envWatch) check() {
	data, err := os.ReadFile(w.path)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reads++
	if err != nil {
		w.bad = append(w.bad, err.Error())
		return
	}
	e, err := subnet.ParseEnv(data)
	want := w.base
	want.MTU = e.MTU
	switch {
	case err != nil:
		w.bad = append(w.bad, fmt.Sprintf("unparsable: %v: %q", err, data))
	case !w.allowed[e.MTU] || !bytes.Equal(data, want.Marshal()):
		w.bad = append(w.bad, fmt.Sprintf("neither the old nor the new file (MTU %d allowed: %v): %q", e.MTU, w.allowed, data))
	default:
		w.seen[string(data)] = true
	}
}

// expect allows the file with mtu besides the current one (a change is
// coming).
func (w *envWatch) expect(mtu int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.allowed[mtu] = true
	w.latest = mtu
}

// settle checks that the file is now the newest allowed one and forbids
// the older ones from here on; it fails t on anything bad seen so far.
func (w *envWatch) settle(t *testing.T) {
	t.Helper()
	w.check()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.bad) > 0 {
		t.Fatalf("subnet.env read %d times, %d bad reads, first: %s", w.reads, len(w.bad), w.bad[0])
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		t.Fatal(err)
	}
	e, err := subnet.ParseEnv(data)
	if err != nil {
		t.Fatal(err)
	}
	if e.MTU != w.latest {
		t.Fatalf("subnet.env has MTU %d after the restart, want %d (underlay MTU - 50)", e.MTU, w.latest)
	}
	w.allowed = map[int]bool{e.MTU: true}
}

func (w *envWatch) close() (reads, distinct int) {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reads, len(w.seen)
}
