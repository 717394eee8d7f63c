package peerhealth

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/overlaynet/overlay/backend"
)

// liveHeap is the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// proberHolding returns a prober whose schedule holds peers (IPv4), taken
// from SetPeers as Run takes them, and the live heap it costs.
func proberHolding(peers []backend.Peer) (*Prober, uint64) {
	before := liveHeap()
	p := New(Config{Families: []backend.Family{backend.IPv4}, Rand: rand.New(rand.NewPCG(1, 2))})
	p.SetPeers(backend.IPv4, peers)
	p.mu.Lock()
	p.takePending(time.Now(), [2]bool{true, false})
	p.mu.Unlock()
	return p, liveHeap() - before
}

// BenchmarkScheduleMemory measures what the prober keeps of 10,000 peers
// (the live heap of a prober after it took them, per peer), what one
// setPeers of 10,000 into an empty schedule allocates, and what handing
// the same set over again costs. Before the schedule was packed
// (3edebbe): 325 bytes a peer for the schedule and 65 for the copy of the
// set kept beside it; 4.7 MB in 10,090 allocations for the first set of
// 10,000. See Documentation/benchmarks.md.
func BenchmarkScheduleMemory(b *testing.B) {
	const n = 10000
	peers := peersOf(n)
	b.Run("kept", func(b *testing.B) {
		var per float64
		for b.Loop() {
			p, live := proberHolding(peers)
			per = float64(live) / n
			runtime.KeepAlive(p)
		}
		b.ReportMetric(per, "B/peer")
	})
	b.Run("setPeers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s := newSchedule(Settings{}, rand.New(rand.NewPCG(1, 2)))
			s.setPeers(t0, peers, nil)
		}
	})
	b.Run("publish again", func(b *testing.B) {
		// A watch batch: the set handed over again, and taken (before:
		// 1.2 MB in 33 allocations, a copy of the set and a map of it).
		p, _ := proberHolding(peers)
		b.ReportAllocs()
		for b.Loop() {
			p.SetPeers(backend.IPv4, peers)
			p.mu.Lock()
			p.takePending(time.Now(), [2]bool{true, false})
			p.mu.Unlock()
		}
	})
}

// The prober keeps about 115 bytes a peer (BenchmarkScheduleMemory; 390
// before its schedule was packed): a regression past half as much again
// fails here.
func TestProberMemoryPerPeer(t *testing.T) {
	const n = 10000
	peers := peersOf(n)
	p, live := proberHolding(peers)
	if got := len(p.Peers()); got != n {
		t.Fatalf("%d peers probed, want %d", got, n)
	}
	if per := float64(live) / n; per > 172 {
		t.Errorf("the prober keeps %.0f bytes a peer of %d, over the ceiling of 172 (115 when measured)", per, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending[0] != nil || p.pending[1] != nil {
		t.Error("the peer set handed over was kept once the schedule took it")
	}
}

// An entry is 104 bytes with no pointer in it: the collector never scans
// the thousands of them, and a field added shows here.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry{}); got > 104 {
		t.Errorf("an entry is %d bytes, want at most 104", got)
	}
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, path string) {
		switch ty.Kind() {
		case reflect.Struct:
			for i := range ty.NumField() {
				walk(ty.Field(i).Type, path+"."+ty.Field(i).Name)
			}
		case reflect.Array:
			walk(ty.Elem(), path+"[]")
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.String, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
			t.Errorf("entry%s is a %s: it holds a pointer", path, ty.Kind())
		}
	}
	walk(reflect.TypeFor[entry](), "")
}

// A key and an address come back from their packed form as they went in,
// and packed addresses order as netip orders them.
func TestPackedKeysRoundTrip(t *testing.T) {
	addrs := []netip.Addr{{}, netip.MustParseAddr("10.244.7.0"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"),
		netip.MustParseAddr("::ffff:10.244.7.0"), netip.MustParseAddr("::"), netip.MustParseAddr("fd00:10:244:7::"), netip.MustParseAddr("2001:db8::7")}
	for _, a := range addrs {
		if got := packAddr(a).Addr(); got != a {
			t.Errorf("address %v came back as %v", a, got)
		}
		for _, b := range addrs {
			if got, want := packAddr(a).compare(packAddr(b)), a.Compare(b); got != want {
				t.Errorf("%v against %v: %d, netip says %d", a, b, got, want)
			}
		}
		for _, bits := range []int{-1, 0, 24, 32, 64, 128} {
			for _, fam := range []backend.Family{0, backend.IPv4, backend.IPv6} {
				k := Key{Family: fam, Subnet: netip.PrefixFrom(a, bits)}
				if got := packKey(k).Key(); got != k {
					t.Errorf("key %+v came back as %+v", k, got)
				}
			}
		}
	}
}

// The index finds every key it holds, and none it does not, through a
// long run of inserts, moves and deletes in a table small enough to wrap
// around and collide.
func TestPeerIndexAgainstAMap(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 12))
	x := newPeerIndex()
	var peers []entry // as the schedule keeps them: the last fills a gap
	want := map[pkey]int{}
	keyOf := func(i int) pkey {
		return packKey(Key{Family: backend.IPv4, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24)})
	}
	for step := range 5000 {
		k := keyOf(rnd.IntN(200))
		if pos, ok := want[k]; ok && rnd.IntN(2) == 0 {
			x.delete(peers, k)
			last := len(peers) - 1
			if pos != last {
				x.move(peers, peers[last].key, pos)
				peers[pos] = peers[last]
				want[peers[pos].key] = pos
			}
			peers = peers[:last]
			delete(want, k)
		} else if !ok {
			peers = append(peers, entry{key: k})
			x.insert(peers, k, len(peers)-1)
			want[k] = len(peers) - 1
		}
		if x.n != len(want) || x.n*4 > len(x.slots)*3 {
			t.Fatalf("step %d: %d keys in %d slots, want %d keys at most 3/4 full", step, x.n, len(x.slots), len(want))
		}
		for i := range 200 {
			k := keyOf(i)
			pos, ok := want[k]
			if !ok {
				pos = -1
			}
			if got := x.find(peers, k); got != pos {
				t.Fatalf("step %d: %v found at %d, want %d", step, k.Key().Subnet, got, pos)
			}
		}
	}
}

// Through peer sets coming and going in both families (names given twice
// included) with probes in flight, the schedule's records, index and
// heap agree: each peer of the last set once, found where it is, queued
// unless in flight, the heap ordered.
func TestScheduleStaysConsistent(t *testing.T) {
	rnd := rand.New(rand.NewPCG(13, 14))
	s := newSchedule(Settings{Sweep: time.Second, Rate: 1000}, rand.New(rand.NewPCG(15, 16)))
	all := [2][]backend.Peer{peersOf(300), nil}
	for i := range 300 {
		all[1] = append(all[1], backend.Peer{Subnet: netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 6: byte(i >> 8), 7: byte(i)}), 64), PublicIP: netip.MustParseAddr("2001:db8::1")})
	}
	now := t0
	inflight := map[Key]bool{}
	for round := range 200 {
		now = now.Add(10 * time.Millisecond)
		var sets [2][]backend.Peer
		want := map[Key]netip.Addr{}
		for f, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
			for _, pe := range all[f] {
				if rnd.IntN(3) == 0 {
					continue
				}
				pe.PublicIP = netip.AddrFrom4([4]byte{198, 18, 0, byte(rnd.IntN(256))})
				sets[f] = append(sets[f], pe)
				if rnd.IntN(20) == 0 { // named twice: the later one counts
					pe.PublicIP = netip.AddrFrom4([4]byte{198, 19, 0, byte(rnd.IntN(256))})
					sets[f] = append(sets[f], pe)
				}
			}
			rnd.Shuffle(len(sets[f]), func(i, j int) { sets[f][i], sets[f][j] = sets[f][j], sets[f][i] })
			for _, pe := range sets[f] {
				want[Key{Family: fam, Subnet: pe.Subnet}] = pe.PublicIP
			}
		}
		s.setPeers(now, sets[0], sets[1])
		for k := range inflight {
			if _, ok := want[k]; !ok {
				delete(inflight, k)
			}
		}
		// Send some and end some.
		for range rnd.IntN(20) {
			if e, _ := s.next(); e != nil {
				s.sent(e, now)
				inflight[e.key.Key()] = true
			}
		}
		for k := range inflight {
			if rnd.IntN(2) == 0 {
				if rnd.IntN(2) == 0 {
					s.answered(k, time.Millisecond, now)
				} else {
					s.lost(k, now)
				}
				delete(inflight, k)
			}
		}
		if len(s.peers) != len(want) || s.index.n != len(want) || len(s.due)+len(inflight) != len(want) {
			t.Fatalf("round %d: %d records, %d indexed, %d queued + %d in flight; want %d peers", round, len(s.peers), s.index.n, len(s.due), len(inflight), len(want))
		}
		for k, pub := range want {
			e := s.lookup(k)
			switch {
			case e == nil:
				t.Fatalf("round %d: %v not found", round, k)
			case e.key.Key() != k || e.public.Addr() != pub:
				t.Fatalf("round %d: %v found as %v at %v, want at %v", round, k, e.key.Key(), e.public.Addr(), pub)
			case (e.index < 0) != inflight[k]:
				t.Fatalf("round %d: %v queued at %d, in flight %v", round, k, e.index, inflight[k])
			}
		}
		for h, i := range s.due {
			if int(s.peers[i].index) != h {
				t.Fatalf("round %d: heap place %d holds a record that says %d", round, h, s.peers[i].index)
			}
			if h > 0 && s.earlier(h, (h-1)/2) {
				t.Fatalf("round %d: heap place %d due before its parent", round, h)
			}
		}
	}
}
