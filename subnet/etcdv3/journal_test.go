package etcdv3

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"

	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3/journal"
)

// listingCounter counts the reads of values under a prefix that a client
// sends (ranges that are not count-only), inside transactions too.
type listingCounter struct {
	prefix string
	n      atomic.Int64
}

func (c *listingCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ranges := []*etcdserverpb.RangeRequest{}
	switch r := req.(type) {
	case *etcdserverpb.RangeRequest:
		ranges = append(ranges, r)
	case *etcdserverpb.TxnRequest:
		for _, op := range append(r.Success, r.Failure...) {
			if rr := op.GetRequestRange(); rr != nil {
				ranges = append(ranges, rr)
			}
		}
	}
	for _, r := range ranges {
		if len(r.RangeEnd) > 0 && !r.CountOnly && strings.HasPrefix(string(r.Key), c.prefix) {
			c.n.Add(1)
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// countedManager is host h's manager on its own client, whose listings of
// the leases are counted.
func (f *fixture) countedManager(t *testing.T, h Host, log *slog.Logger) (*Manager, *listingCounter) {
	t.Helper()
	c := &listingCounter{prefix: f.reg.SubnetsPrefix()}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{f.srv.Endpoint}, DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(c.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return NewManager(NewRegistry(cli, DefaultPrefix), f.cfg, h, ManagerOptions{Logger: log}), c
}

// follow applies the watch's batches to j until it has seen revision rev.
func follow(t *testing.T, ch <-chan Batch, j *Journal, rev int64) {
	t.Helper()
	for seen := int64(0); seen < rev; {
		b := recv(t, ch)
		if err := j.Apply(b); err != nil {
			t.Fatal(err)
		}
		seen = b.Revision
	}
}

// createJournal writes snap as a new journal at path.
func createJournal(t *testing.T, path string, reg *Registry, snap Snapshot) *Journal {
	t.Helper()
	j, _, err := OpenJournal(path, reg)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := j.Start(snap); err != nil {
		t.Fatal(err)
	}
	return j
}

// loadJournal is the lease set the journal at path holds.
func loadJournal(path string, reg *Registry) (Snapshot, error) {
	j, snap, err := OpenJournal(path, reg)
	j.Close()
	return snap, err
}

// journalOf writes the journal a host that started from snap keeps: snap,
// then what its watch delivered up to etcd's current revision (its own
// new lease, for one).
func journalOf(t *testing.T, f *fixture, snap Snapshot) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "subnet.env.leases")
	j := createJournal(t, path, f.reg, snap)
	defer j.Close()
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	follow(t, f.reg.Watch(wctx, snap, WatchOptions{Progress: true}), j, currentRev(t, f))
	return path
}

func currentRev(t *testing.T, f *fixture) int64 {
	t.Helper()
	resp, err := f.cli.Get(ctx(t), "any")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// sameSet fails unless got holds what etcd held under the leases' prefix
// at got's revision.
func sameSet(t *testing.T, f *fixture, got Snapshot) {
	t.Helper()
	resp, err := f.cli.Get(ctx(t), f.reg.SubnetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(got.Revision))
	if err != nil {
		t.Fatal(err)
	}
	want := Snapshot{ClusterID: resp.Header.ClusterId}
	for _, kv := range resp.Kvs {
		if l, err := f.reg.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision); err != nil {
			want.Invalid = append(want.Invalid, Invalid{Key: string(kv.Key)})
		} else {
			want.Leases = append(want.Leases, l)
		}
	}
	show := func(s Snapshot) string {
		var b strings.Builder
		for _, l := range s.Leases {
			v, _ := l.Attrs.Marshal()
			b.WriteString(l.Key() + " " + string(v) + "\n")
		}
		for _, inv := range s.Invalid {
			b.WriteString(inv.Key + " invalid\n")
		}
		return b.String()
	}
	if show(got) != show(want) || got.ClusterID != want.ClusterID {
		t.Fatalf("journal holds (cluster %x)\n%swant (cluster %x)\n%s", got.ClusterID, show(got), want.ClusterID, show(want))
	}
}

// The journal holds what the watch delivered: adds, changes, removals,
// invalid values and their deletion, and the revision of the last batch.
func TestJournalHoldsTheLeaseSetTheWatchDelivered(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	for i := range 3 {
		if _, _, err := f.manager(host(i), ManagerOptions{}).Acquire(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	_, snap, err := f.manager(host(3), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "subnet.env.leases")
	j := createJournal(t, path, f.reg, snap)
	defer j.Close()
	ch := f.reg.Watch(ctx(t), snap, WatchOptions{Progress: true})

	changed := host(1)
	changed.BackendData = vxlanData(net.HardwareAddr{0x0e, 9, 9, 9, 9, 9})
	if _, _, err := f.manager(changed, ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.manager(host(4), ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	gone := snap.Leases[0]
	if _, err := f.reg.Delete(ctx(t), gone.Subnets()); err != nil {
		t.Fatal(err)
	}
	bad := DefaultPrefix + "/subnets/10.244.250.0-24"
	for _, v := range []string{"not json", "still not json"} {
		if _, err := f.cli.Put(ctx(t), bad, v); err != nil {
			t.Fatal(err)
		}
	}
	follow(t, ch, j, currentRev(t, f))
	saved, err := loadJournal(path, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, f, saved)
	if len(saved.Invalid) != 1 || saved.Invalid[0].Key != bad || !strings.Contains(saved.Invalid[0].Err.Error(), "JSON") {
		t.Errorf("invalid keys %+v, want %s with its error", saved.Invalid, bad)
	}

	// The invalid key deleted; then only etcd's revision moves on: the
	// journal follows it through the watch's progress batches.
	if _, err := f.cli.Delete(ctx(t), bad); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx(t), DefaultPrefix+"/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	rev := currentRev(t, f)
	follow(t, ch, j, rev)
	if saved, err = loadJournal(path, f.reg); err != nil || saved.Revision != rev {
		t.Fatalf("journal at revision %d (%v), want %d", saved.Revision, err, rev)
	}
	sameSet(t, f, saved)
}

// A restarted host with a journal adopts its lease without listing every
// lease, and its watch delivers what changed while it was down.
func TestRestartResumesFromTheJournalWithoutListing(t *testing.T) {
	f := newFixture(t, testNetwork)
	var others []subnet.Lease
	for i := 2; i <= 3; i++ {
		l, _, err := f.manager(host(i), ManagerOptions{}).Acquire(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, l)
	}
	m, listings := f.countedManager(t, host(1), nil)
	first, snap, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	path := journalOf(t, f, snap)

	// While host 1 is down, host 4 joins and host 2 leaves.
	joined, _, err := f.manager(host(4), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Delete(ctx(t), others[0].Subnets()); err != nil {
		t.Fatal(err)
	}

	saved, err := loadJournal(path, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	m, listings = f.countedManager(t, host(1), nil)
	again, from, err := m.AcquireFrom(ctx(t), saved)
	if err != nil {
		t.Fatal(err)
	}
	if n := listings.n.Load(); n != 0 {
		t.Errorf("the restart listed the leases %d times, want none", n)
	}
	if again.Subnet != first.Subnet || again.EtcdLease != first.EtcdLease || from.Revision != saved.Revision {
		t.Fatalf("restart: %s (etcd lease %x) from revision %d; want %s (%x) from %d", again.Subnet, again.EtcdLease, from.Revision, first.Subnet, first.EtcdLease, saved.Revision)
	}
	ch := f.reg.Watch(ctx(t), from, WatchOptions{})
	got := map[netip.Prefix]subnet.EventType{}
	for rev := currentRev(t, f); len(got) < 2; {
		b := recv(t, ch)
		for _, ev := range b.Events {
			if ev.Lease.Subnet != first.Subnet {
				got[ev.Lease.Subnet] = ev.Type
			}
		}
		if b.Revision >= rev && len(got) < 2 {
			t.Fatalf("the watch from the journal's revision is current with events %v", got)
		}
	}
	if got[joined.Subnet] != subnet.Added || got[others[0].Subnet] != subnet.Removed {
		t.Errorf("events after the restart %v; want %s added, %s removed", got, joined.Subnet, others[0].Subnet)
	}
}

// A watch from a resumed saved set says when it has caught up with etcd
// as it was when the set was checked (Snapshot.Head) — at once, not after
// a quiet ProgressInterval, and with no lease changed meanwhile too: the
// daemon is ready only then.
func TestWatchFromASavedSetSaysWhenCurrent(t *testing.T) {
	for _, leaseChanged := range []bool{false, true} {
		t.Run(fmt.Sprint("lease changed meanwhile: ", leaseChanged), func(t *testing.T) {
			// No progress notifications but those asked for.
			f := newFixture(t, testNetwork, func(c *embed.Config) { c.WatchProgressNotifyInterval = time.Hour })
			h, first, snap := joinSecond(t, f)
			saved, err := loadJournal(journalOf(t, f, snap), f.reg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.cli.Put(ctx(t), DefaultPrefix+"/elsewhere", "x"); err != nil {
				t.Fatal(err)
			}
			if leaseChanged {
				if _, _, err := f.manager(host(3), ManagerOptions{}).Acquire(ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.cli.Put(ctx(t), DefaultPrefix+"/elsewhere", "y"); err != nil {
				t.Fatal(err)
			}
			h.Previous = first.Subnets()
			_, from, err := f.manager(h, ManagerOptions{}).AcquireFrom(ctx(t), saved)
			if err != nil || !from.Saved || from.Head <= from.Revision {
				t.Fatalf("AcquireFrom: saved %v, revision %d, head %d, %v; want a saved set behind its head", from.Saved, from.Revision, from.Head, err)
			}
			ch := f.reg.Watch(ctx(t), from, WatchOptions{ProgressInterval: time.Hour})
			events := 0
			for {
				b := recv(t, ch)
				events += len(b.Events)
				if b.Revision >= from.Head {
					break
				}
			}
			if leaseChanged != (events > 0) {
				t.Errorf("caught up with %d events; a lease changed meanwhile: %v", events, leaseChanged)
			}
		})
	}
}

// joinSecond acquires host(2)'s lease, then host(1)'s, and returns
// host(1), its lease and the listing its Acquire returned: host(2)'s
// lease, not its own.
func joinSecond(t *testing.T, f *fixture) (Host, subnet.Lease, Snapshot) {
	t.Helper()
	if _, _, err := f.manager(host(2), ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	h := host(1)
	first, snap, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return h, first, snap
}

// A journal saved before the host's own new lease arrived on the watch (a
// daemon stopped right after its first start) still serves: the host's
// key is the previous subnet file's.
func TestJournalWithoutOwnLeaseResumesFromPreviousSubnet(t *testing.T) {
	f := newFixture(t, testNetwork)
	h, first, snap := joinSecond(t, f)
	path := filepath.Join(t.TempDir(), "subnet.env.leases")
	createJournal(t, path, f.reg, snap).Close() // the listing, without first
	saved, err := loadJournal(path, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	h.Previous = first.Subnets()
	m, listings := f.countedManager(t, h, nil)
	again, from, err := m.AcquireFrom(ctx(t), saved)
	if err != nil || listings.n.Load() != 0 || again.Subnet != first.Subnet || again.EtcdLease != first.EtcdLease || from.Revision != saved.Revision {
		t.Fatalf("AcquireFrom = %s (etcd lease %x) from %d, %v, %d listings; want %s (%x) from %d without listing",
			again.Subnet, again.EtcdLease, from.Revision, err, listings.n.Load(), first.Subnet, first.EtcdLease, saved.Revision)
	}
	// The key is not in the saved set, but this start did not create it.
	if m.Created() {
		t.Errorf("resuming this host's lease from the previous subnet file counts as creating it")
	}
}

// A journal etcd cannot vouch for is not used: the host says why, lists
// every lease and starts from that listing.
func TestStaleJournalIsNotUsed(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	for _, tc := range []struct {
		name, reason string
		// meanwhile changes etcd or the saved set while the host is down.
		meanwhile  func(t *testing.T, f *fixture, saved *Snapshot, own subnet.Lease)
		newSubnet  bool // the host gets another subnet
		noPrevious bool // there is no previous subnet file
	}{
		{"compacted", "compacted", func(t *testing.T, f *fixture, _ *Snapshot, _ subnet.Lease) {
			if _, err := f.cli.Put(ctx(t), DefaultPrefix+"/elsewhere", "x"); err != nil {
				t.Fatal(err)
			}
			f.srv.Compact(t, f.cli)
		}, false, false},
		{"revision beyond etcd's", "re-created or restored", func(t *testing.T, _ *fixture, saved *Snapshot, _ subnet.Lease) {
			saved.Revision += 1000
		}, false, false},
		{"another cluster", "cluster", func(t *testing.T, _ *fixture, saved *Snapshot, _ subnet.Lease) {
			saved.ClusterID ^= 1
		}, false, false},
		{"own key missing from the set", "the saved set as written at 0", func(t *testing.T, _ *fixture, saved *Snapshot, own subnet.Lease) {
			for i := range saved.Leases {
				if saved.Leases[i].Subnet == own.Subnet {
					saved.Leases = append(saved.Leases[:i], saved.Leases[i+1:]...)
					return
				}
			}
		}, false, false},
		{"own key at another revision in the set", "etcd held this host's key", func(t *testing.T, _ *fixture, saved *Snapshot, own subnet.Lease) {
			for i := range saved.Leases {
				if saved.Leases[i].Subnet == own.Subnet {
					saved.Leases[i].ModRevision--
				}
			}
		}, false, false},
		{"own key deleted", "is gone", func(t *testing.T, f *fixture, _ *Snapshot, own subnet.Lease) {
			if _, err := f.reg.Delete(ctx(t), own.Subnets()); err != nil {
				t.Fatal(err)
			}
		}, false, false},
		{"own key taken by another node", "now names node", func(t *testing.T, f *fixture, _ *Snapshot, own subnet.Lease) {
			v, _ := peerLeaseAttrs().Marshal()
			if _, err := f.cli.Put(ctx(t), f.reg.LeaseKey(own.Subnets()), string(v)); err != nil {
				t.Fatal(err)
			}
		}, true, false},
		{"own subnet held by another node", "as the holder of this host's previous subnet", func(t *testing.T, _ *fixture, saved *Snapshot, own subnet.Lease) {
			for i := range saved.Leases {
				if saved.Leases[i].Subnet == own.Subnet {
					saved.Leases[i].Attrs = peerLeaseAttrs()
				}
			}
		}, false, false},
		{"no lease of this host, no subnet file", "no previous subnet file", func(t *testing.T, _ *fixture, saved *Snapshot, own subnet.Lease) {
			for i := range saved.Leases {
				if saved.Leases[i].Subnet == own.Subnet {
					saved.Leases = append(saved.Leases[:i], saved.Leases[i+1:]...)
					return
				}
			}
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, testNetwork)
			for i := 2; i <= 3; i++ {
				if _, _, err := f.manager(host(i), ManagerOptions{}).Acquire(ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
			h := host(1)
			own, snap, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			path := journalOf(t, f, snap)
			saved, err := loadJournal(path, f.reg)
			if err != nil {
				t.Fatal(err)
			}
			tc.meanwhile(t, f, &saved, own)

			var logs syncBuffer
			if !tc.noPrevious {
				h.Previous = own.Subnets() // from subnet.env, as overlayd does
			}
			m, listings := f.countedManager(t, h, slog.New(slog.NewTextHandler(&logs, nil)))
			l, got, err := m.AcquireFrom(ctx(t), saved)
			if err != nil {
				t.Fatal(err)
			}
			if listings.n.Load() != 1 || got.Revision <= snap.Revision {
				t.Errorf("%d listings, snapshot at revision %d (saved at %d); want a new listing", listings.n.Load(), got.Revision, snap.Revision)
			}
			if !strings.Contains(logs.String(), "saved lease set not used") || !strings.Contains(logs.String(), tc.reason) {
				t.Errorf("log does not say why (%q):\n%s", tc.reason, logs.String())
			}
			if (l.Subnet != own.Subnet) != tc.newSubnet || !l.Attrs.OwnedBy(h.NodeID, h.PublicIP) {
				t.Errorf("acquired %s %+v; had %s", l.Subnet, l.Attrs, own.Subnet)
			}
			sameSet(t, f, got)
		})
	}
}

func peerLeaseAttrs() subnet.LeaseAttrs {
	return vxlanAttrs(netip.MustParseAddr("198.19.9.9"), 1, net.HardwareAddr{0x0e, 9, 9, 9, 9, 8}, "someone-else", "")
}

// journalLeases are n leases for unit tests of the file.
func journalLeases(n int) []subnet.Lease {
	var out []subnet.Lease
	for i := range n {
		out = append(out, subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
			Attrs:     vxlanAttrs(netip.AddrFrom4([4]byte{198, 18, 0, byte(i + 1)}), 1, net.HardwareAddr{0x0e, 0, 0, 0, 0, byte(i)}, "n", ""),
			EtcdLease: int64(100 + i), ModRevision: int64(10 + i)})
	}
	return out
}

// The journal is rewritten once records pile up, so its size follows the
// lease set, not the history; what it holds stays the same.
func TestJournalIsCompacted(t *testing.T) {
	reg := NewRegistry(nil, DefaultPrefix)
	leases := journalLeases(4)
	path := filepath.Join(t.TempDir(), "j")
	j := createJournal(t, path, reg, Snapshot{Leases: leases, Revision: 20, ClusterID: 7})
	defer j.Close()
	biggest := int64(0)
	rev := int64(20)
	for i := range 5000 {
		rev++
		l := leases[i%4]
		l.ModRevision = rev
		l.Attrs.Hostname = strings.Repeat("h", i%7)
		leases[i%4] = l
		if err := j.Apply(Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: l}}, Revision: rev}); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(path); err == nil {
			biggest = max(biggest, fi.Size())
		}
	}
	if biggest > 400<<10 {
		t.Errorf("the journal of 4 leases grew to %d bytes", biggest)
	}
	got, err := loadJournal(path, reg)
	if err != nil || got.Revision != rev || len(got.Leases) != 4 || got.ClusterID != 7 {
		t.Fatalf("after compaction: %+v, %v", got, err)
	}
	for i, l := range got.Leases {
		if l.Attrs.Hostname != leases[i].Attrs.Hostname || l.ModRevision != leases[i].ModRevision {
			t.Errorf("lease %d: %+v, want %+v", i, l, leases[i])
		}
	}
}

// A batch behind the journal's revision is refused and leaves the file as
// it was: appended, it would make the journal unreadable for good.
func TestJournalRefusesABatchBehindIt(t *testing.T) {
	reg := NewRegistry(nil, DefaultPrefix)
	leases := journalLeases(2)
	path := filepath.Join(t.TempDir(), "j")
	j := createJournal(t, path, reg, Snapshot{Leases: leases, Revision: 20, ClusterID: 7})
	defer j.Close()
	l := leases[0]
	l.Attrs.Hostname, l.ModRevision = "new", 30
	if err := j.Apply(Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: l}}, Revision: 30}); err != nil {
		t.Fatal(err)
	}
	l.Attrs.Hostname, l.ModRevision = "stale", 25
	if err := j.Apply(Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: l}}, Revision: 25}); err == nil || !strings.Contains(err.Error(), "revision 25 after 30") {
		t.Fatalf("a batch behind the journal: %v, want it refused", err)
	}
	got, err := loadJournal(path, reg)
	if err != nil || got.Revision != 30 || got.Leases[0].Attrs.Hostname != "new" {
		t.Fatalf("the journal after the refusal: %+v, %v; want it readable at revision 30", got, err)
	}
}

// A re-list of a store that was re-created comes at a lower revision,
// perhaps from another cluster: the journal starts over from the set it
// describes, readable, with the new cluster's ID.
func TestJournalStartsOverWithARecreatedStore(t *testing.T) {
	reg := NewRegistry(nil, DefaultPrefix)
	leases := journalLeases(3)
	path := filepath.Join(t.TempDir(), "j")
	j := createJournal(t, path, reg, Snapshot{Leases: leases, Revision: 300, ClusterID: 7})
	defer j.Close()
	b := Batch{Events: []subnet.Event{{Type: subnet.Removed, Lease: leases[2]}}, Revision: 12, Resync: true, ClusterID: 8}
	if err := j.Apply(b); err != nil {
		t.Fatal(err)
	}
	got, err := loadJournal(path, reg)
	if err != nil || got.Revision != 12 || got.ClusterID != 8 || len(got.Leases) != 2 {
		t.Fatalf("after the re-created store's re-list: %+v, %v; want 2 leases at revision 12 of cluster 8", got, err)
	}
	if err := j.Apply(Batch{Revision: 13}); err != nil {
		t.Errorf("a batch after the start-over: %v", err)
	}
}

// file is a journal of the leases under prefix holding recs at revision 4.
func file(t *testing.T, prefix string, recs ...journal.Record) string {
	t.Helper()
	data, err := journal.Encode(journal.Header{Journal: journal.Version, Prefix: prefix, Cluster: 7}, recs, 4)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The file is untrusted input: whatever it holds, opening it gives a
// clear error naming the file, or a lease set (package journal's tests
// take the format apart); a write cut short leaves the last whole batch.
func TestJournalFileIsCheckedAsInput(t *testing.T) {
	reg := NewRegistry(nil, DefaultPrefix)
	prefix := reg.SubnetsPrefix()
	lease := journal.Record{Kind: journal.KindLease, Key: "10.244.1.0-24", Lease: 5, Mod: 3,
		Value: []byte(`{"PublicIP":"198.18.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}}`)}
	withValue := func(v string) journal.Record { r := lease; r.Value = []byte(v); return r }
	withKey := func(k string) journal.Record { r := lease; r.Key = k; return r }
	for _, tc := range []struct{ name, file, err string }{
		{"empty", "", "header"},
		{"another format", `{"journal":1}` + "\n", "format 1, want 2"},
		{"another prefix", file(t, "/other/subnets/", lease), "under /other/subnets/"},
		{"a value that does not decode", file(t, prefix, withValue(`{"PublicIP":5}`)), "lease 10.244.1.0-24"},
		{"a key that does not parse", file(t, prefix, withKey("10.244.1.0-99")), "10.244.1.0-99"},
		{"a lease changed after it was written", strings.Replace(file(t, prefix, lease), "198.18.0.1", "198.18.0.2", 1), "line 3: checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "j")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			snap, err := loadJournal(path, reg)
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
				t.Fatalf("OpenJournal = %+v, %v; want an error naming the file and %q", snap, err, tc.err)
			}
		})
	}

	// A batch cut short by a crash is cut off; appending goes on after
	// the last whole one.
	path := filepath.Join(t.TempDir(), "j")
	whole := file(t, prefix, lease)
	if err := os.WriteFile(path, []byte(whole+`D "10.244.1.0-24"`+"\n"+`L "10.244.2.0-24" 0 5 {"Pub`), 0o600); err != nil {
		t.Fatal(err)
	}
	j, snap, err := OpenJournal(path, reg)
	if err != nil || snap.Revision != 4 || len(snap.Leases) != 1 || snap.Leases[0].Subnet.String() != "10.244.1.0/24" || snap.Leases[0].EtcdLease != 5 {
		t.Fatalf("a journal cut short opens as %+v, %v; want the lease at revision 4", snap, err)
	}
	if data, _ := os.ReadFile(path); string(data) != whole {
		t.Errorf("after opening, the file holds\n%s\nwant\n%s", data, whole)
	}
	if err := j.Start(snap); err != nil {
		t.Fatal(err)
	}
	if err := j.Apply(Batch{Events: []subnet.Event{{Type: subnet.Removed, Lease: snap.Leases[0]}}, Revision: 6}); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if snap, err := loadJournal(path, reg); err != nil || snap.Revision != 6 || len(snap.Leases) != 0 {
		t.Errorf("after a batch appended: %+v, %v", snap, err)
	}
	if _, err := loadJournal(filepath.Join(t.TempDir(), "none"), reg); !os.IsNotExist(err) {
		t.Errorf("no journal: %v, want not-exist", err)
	}
}

// A lease's value goes into the journal as etcd held it, decoded once where
// it came in and never encoded again (at a cold start with 10,000 leases
// encoding them again was a tenth of the daemon's CPU, issue 33): member
// order, unknown members and spacing kept. A value that spans lines (JSON
// may, a record may not) is written encoded again, on one line, and the
// journal still reads back.
func TestJournalKeepsValuesAsRead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testNetwork)
	asRead := `{"BackendType":"vxlan", "PublicIP":"198.18.0.7","Zone":"b","BackendData":{"VtepMAC":"0e:00:00:00:00:07","VNI":1}}`
	multiline := "{\n  \"PublicIP\": \"198.18.0.8\",\n  \"BackendType\": \"vxlan\",\n  \"BackendData\": {\"VNI\": 1, \"VtepMAC\": \"0e:00:00:00:00:08\"}\n}"
	for key, v := range map[string]string{"10.244.7.0-24": asRead, "10.244.8.0-24": multiline} {
		if _, err := f.cli.Put(ctx(t), f.reg.SubnetsPrefix()+key, v); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Leases) != 2 {
		t.Fatalf("List: %d leases, %v", len(snap.Leases), err)
	}
	path := filepath.Join(t.TempDir(), "subnet.env.leases")
	createJournal(t, path, f.reg, snap).Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := `L "10.244.7.0-24" 0 ` + fmt.Sprint(snap.Leases[0].ModRevision) + " " + asRead + "\n"; !strings.Contains(string(data), want) {
		t.Errorf("journal lacks the value as read:\n%s\nwant the line\n%s", data, want)
	}
	if want := `{"PublicIP":"198.18.0.8","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:08"}}`; !strings.Contains(string(data), want) {
		t.Errorf("journal lacks the multi-line value on one line:\n%s\nwant %s", data, want)
	}
	got, err := loadJournal(path, f.reg)
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, f, got)
}

// A listing's journal is written as it is made, a lease at a time: at a
// cold start it is written while the listing, the peers and the watch are
// all in memory (issue 33), so it must not hold a record of every lease
// besides. A set out of key order (or with invalid keys) is sorted first,
// and both give the same file.
func TestJournalStartKeepsNoRecordOfEveryLease(t *testing.T) {
	reg := NewRegistry(nil, DefaultPrefix)
	const n = 2000
	var leases []subnet.Lease
	for i := range n {
		l := subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24),
			Attrs:     vxlanAttrs(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 1, net.HardwareAddr{0x0e, 0, 0, 0, byte(i >> 8), byte(i)}, "", ""),
			EtcdLease: 7, ModRevision: int64(10 + i)}
		l.Value, _ = l.Attrs.Marshal()
		leases = append(leases, l)
	}
	slices.SortFunc(leases, func(a, b subnet.Lease) int { return strings.Compare(a.Key(), b.Key()) })
	dir := t.TempDir()
	// MemStats counts every goroutine's allocations (an etcd server of
	// another test may still be stopping): the least of three rounds is
	// this code's.
	write := func(name string, snap Snapshot) (string, uint64) {
		least := uint64(math.MaxUint64)
		for range 3 {
			j, _, _ := OpenJournal(filepath.Join(dir, name), reg)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := j.Start(snap)
			runtime.ReadMemStats(&after)
			j.Close()
			if err != nil {
				t.Fatal(err)
			}
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data), least
	}
	sorted, allocated := write("sorted", Snapshot{Leases: leases, Revision: 5000, ClusterID: 7})
	// A key's string (16 bytes) and the writer's buffer: a record each
	// (~100 bytes) would be 200 KB.
	if limit := uint64(n*48 + 96<<10); allocated > limit {
		t.Errorf("Start allocated %d bytes for %d leases, want at most %d", allocated, n, limit)
	}
	shuffled := slices.Clone(leases)
	shuffled[0], shuffled[n-1] = shuffled[n-1], shuffled[0]
	if got, _ := write("shuffled", Snapshot{Leases: shuffled, Revision: 5000, ClusterID: 7}); got != sorted {
		t.Errorf("a set out of order gives another file")
	}
	if snap, err := loadJournal(filepath.Join(dir, "sorted"), reg); err != nil || len(snap.Leases) != n {
		t.Fatalf("journal reads back %d leases, %v", len(snap.Leases), err)
	}
}
