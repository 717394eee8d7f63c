package guard_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

const port = 8472

// guardLab is an underlay with three hosts: h1 guards its VXLAN port (a
// plain UDP socket on it stands in for the VXLAN device's), h2 is a peer,
// x (198.18.0.9) holds no lease.
type guardLab struct {
	ul        *lab.Underlay
	h1, h2, x *lab.Host
	received  map[netip.Addr]*atomic.Int64 // datagrams h1's socket got, by source
}

func newGuardLab(t *testing.T) *guardLab {
	t.Helper()
	testenv.RequireRoot(t)
	ul, err := lab.NewUnderlay("guard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ul.Close() })
	l := &guardLab{ul: ul, received: map[netip.Addr]*atomic.Int64{}}
	for _, h := range []struct {
		p    **lab.Host
		name string
		n    int
	}{{&l.h1, "h1", 1}, {&l.h2, "h2", 2}, {&l.x, "x", 9}} {
		if *h.p, err = ul.AddHost(h.name, h.n); err != nil {
			t.Fatal(err)
		}
	}
	for _, src := range []netip.Addr{l.h2.IP, l.h2.IPv6, l.x.IP, l.x.IPv6} {
		l.received[src] = new(atomic.Int64)
	}
	for _, a := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		conn, err := lab.ListenUDP(l.h1.NS, netip.AddrPortFrom(a, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				if c := l.received[from.Addr().Unmap()]; c != nil {
					c.Add(1)
				}
			}
		}()
	}
	return l
}

// send sends n datagrams from host h's address src to h1's dst port.
func send(t *testing.T, h *lab.Host, src, dst netip.Addr, n int) {
	t.Helper()
	err := lab.Do(h.NS, func() error {
		conn, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, port)))
		if err != nil {
			return err
		}
		defer conn.Close()
		for range n {
			if _, err := conn.Write([]byte("vxlan-ish")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send from %s: %v", src, err)
	}
}

func newGate(t *testing.T, ns lab.Host, fam backend.Family) *guard.Gate {
	t.Helper()
	g, err := guard.New(fam, port, guard.WithNetNS(ns.NS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// at is peers at the public addresses as (their other fields do not
// matter to the guard).
func at(as ...netip.Addr) []backend.Peer {
	out := make([]backend.Peer, len(as))
	for i, a := range as {
		out[i] = backend.Peer{PublicIP: a}
	}
	return out
}

func snapshot(t *testing.T, g *guard.Gate) guard.Snapshot {
	t.Helper()
	s, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestGuardAdmitsPeersAndDropsAndCountsTheRest(t *testing.T) {
	l := newGuardLab(t)
	for _, tc := range []struct {
		fam       backend.Family
		peer, bad netip.Addr
		dst       netip.Addr
	}{
		{backend.IPv4, l.h2.IP, l.x.IP, l.h1.IP},
		{backend.IPv6, l.h2.IPv6, l.x.IPv6, l.h1.IPv6},
	} {
		t.Run(tc.fam.String(), func(t *testing.T) {
			g := newGate(t, *l.h1, tc.fam)
			if err := g.Admit(at(tc.peer), false); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			s := snapshot(t, g)
			if !s.Present || !slices.Equal(s.Admitted, []netip.Addr{tc.peer}) || s.Dropped != 0 {
				t.Fatalf("after Admit: %+v, want present, [%s], 0 dropped", s, tc.peer)
			}
			send(t, l.x, tc.bad, tc.dst, 20)
			send(t, l.h2, tc.peer, tc.dst, 20)
			testenv.WaitFor(t, 5*time.Second, "the peer's 20 datagrams", func() bool { return l.received[tc.peer].Load() == 20 })
			testenv.WaitFor(t, 5*time.Second, "20 drops counted", func() bool { return snapshot(t, g).Dropped == 20 })
			if n := l.received[tc.bad].Load(); n != 0 {
				t.Errorf("the socket got %d datagrams from %s, which holds no lease", n, tc.bad)
			}
			// The refused source is recorded, the admitted one is not.
			if r, err := g.Refused(); err != nil || !slices.Equal(r, []netip.Addr{tc.bad}) {
				t.Errorf("Refused = %v, %v; want [%s]", r, err, tc.bad)
			}
			if s, err := guard.Read(l.h1.NS, tc.fam, port); err != nil || !slices.Equal(s.Refused, []netip.Addr{tc.bad}) {
				t.Errorf("Read().Refused = %+v, %v; want [%s]", s, err, tc.bad)
			}

			// The peer leaves: its datagrams are dropped from then on.
			if err := g.Settle(nil, nil); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			send(t, l.h2, tc.peer, tc.dst, 5)
			testenv.WaitFor(t, 5*time.Second, "25 drops counted", func() bool { return snapshot(t, g).Dropped == 25 })
			if n := l.received[tc.peer].Load(); n != 20 {
				t.Errorf("the socket got %d datagrams from the peer, want the 20 sent while it was admitted", n)
			}
		})
	}
}

// A host whose lease publishes one address but whose VXLAN datagrams
// leave from another (flanneld's --public-ip, a second address, a VIP):
// the guard drops them, and reports the address they came from, which is
// what the daemon logs and shows so that the operator can fix
// --public-ip.
func TestGuardReportsTheSourceOfDatagramsFromAnUnpublishedAddress(t *testing.T) {
	l := newGuardLab(t)
	published := netip.MustParseAddr("198.18.0.102") // h2's lease says this
	withHandle(t, l.h2.NS, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		return h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: published.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	g := newGate(t, *l.h1, backend.IPv4)
	if err := g.Admit(at(published), true); err != nil {
		t.Fatal(err)
	}
	send(t, l.h2, l.h2.IP, l.h1.IP, 7) // leaves from 198.18.0.2, its interface address
	testenv.WaitFor(t, 5*time.Second, "7 drops", func() bool { return snapshot(t, g).Dropped == 7 })
	if n := l.received[l.h2.IP].Load(); n != 0 {
		t.Errorf("the socket got %d datagrams from the unpublished address", n)
	}
	s := snapshot(t, g)
	if !slices.Equal(s.Refused, []netip.Addr{l.h2.IP}) || !slices.Equal(s.Admitted, []netip.Addr{published}) {
		t.Errorf("snapshot %+v; want %s admitted and %s refused", s, published, l.h2.IP)
	}
}

// The refused set is capped: once it is full, the datagrams of sources it
// cannot record are dropped all the same (recording is a rule apart).
func TestGuardDropsWhenTheRefusedSetIsFull(t *testing.T) {
	l := newGuardLab(t)
	g := newGate(t, *l.h1, backend.IPv4)
	if err := g.Admit(nil, true); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(l.h1.NS)))
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: guard.TableName}
	set := &nftables.Set{Table: table, Name: guard.RefusedSetName(backend.IPv4), KeyType: nftables.TypeIPAddr}
	var fill []nftables.SetElement
	for i := range guard.RefusedMax {
		fill = append(fill, nftables.SetElement{Key: []byte{10, 200, byte(i >> 8), byte(i)}, Timeout: time.Hour})
	}
	if err := c.SetAddElements(set, fill); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	send(t, l.x, l.x.IP, l.h1.IP, 4)
	testenv.WaitFor(t, 5*time.Second, "4 drops with the refused set full", func() bool { return snapshot(t, g).Dropped == 4 })
	if n := l.received[l.x.IP].Load(); n != 0 {
		t.Errorf("the socket got %d datagrams while the refused set was full", n)
	}
	if r, err := g.Refused(); err != nil || len(r) != guard.RefusedMax || slices.Contains(r, l.x.IP) {
		t.Errorf("Refused: %d addresses (has %s: %v), %v; want the %d of the full set", len(r), l.x.IP, slices.Contains(r, l.x.IP), err, guard.RefusedMax)
	}
}

func TestGuardProbe(t *testing.T) {
	l := newGuardLab(t)
	if err := guard.Probe(l.h1.NS); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	// It leaves nothing behind.
	c, err := nftables.New(nftables.WithNetNSFd(int(l.h1.NS)))
	if err != nil {
		t.Fatal(err)
	}
	if tables, err := c.ListTables(); err != nil || len(tables) != 0 {
		t.Errorf("tables after Probe: %d, %v; want none", len(tables), err)
	}
}

func TestGuardRestartWithTheSamePeersWritesNothing(t *testing.T) {
	l := newGuardLab(t)
	for _, tc := range []struct {
		fam   backend.Family
		peers []netip.Addr
	}{
		{backend.IPv4, []netip.Addr{l.h2.IP, netip.MustParseAddr("198.19.0.1")}},
		{backend.IPv6, []netip.Addr{l.h2.IPv6, netip.MustParseAddr("2001:db8::1")}},
	} {
		t.Run(tc.fam.String(), func(t *testing.T) {
			first := newGate(t, *l.h1, tc.fam)
			if err := first.Admit(at(tc.peers...), true); err != nil {
				t.Fatal(err)
			}
			if err := first.Settle(at(tc.peers...), nil); err != nil {
				t.Fatal(err)
			}
			// A new daemon: a new Gate adopts the set.
			second := newGate(t, *l.h1, tc.fam)
			if err := second.Admit(at(tc.peers...), true); err != nil {
				t.Fatal(err)
			}
			if err := second.Settle(at(tc.peers...), nil); err != nil {
				t.Fatal(err)
			}
			if n := second.Batches(); n != 0 {
				t.Errorf("a restart with the same peers sent %d nftables transactions, want 0", n)
			}
		})
	}
	// Each family's Gate left the other's state alone.
	for _, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		if s, err := guard.Read(l.h1.NS, fam, port); err != nil || !s.Present || len(s.Admitted) != 2 {
			t.Errorf("%v after both gates ran: %+v, %v", fam, s, err)
		}
	}
}

func TestGuardRepairsDriftAtResync(t *testing.T) {
	l := newGuardLab(t)
	peers := []netip.Addr{l.h2.IP}
	g := newGate(t, *l.h1, backend.IPv4)
	if err := g.Admit(at(peers...), true); err != nil {
		t.Fatal(err)
	}
	send(t, l.x, l.x.IP, l.h1.IP, 3)
	testenv.WaitFor(t, 5*time.Second, "3 drops", func() bool { return snapshot(t, g).Dropped == 3 })

	conn := func() *nftables.Conn {
		c, err := nftables.New(nftables.WithNetNSFd(int(l.h1.NS)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: guard.TableName}
	for _, tc := range []struct {
		name   string
		tamper func(c *nftables.Conn)
	}{
		{"an element deleted", func(c *nftables.Conn) {
			set := &nftables.Set{Table: table, Name: guard.SetName(backend.IPv4), KeyType: nftables.TypeIPAddr}
			if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: l.h2.IP.AsSlice()}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the chain deleted", func(c *nftables.Conn) {
			c.DelChain(&nftables.Chain{Table: table, Name: guard.ChainName(backend.IPv4)})
		}},
		{"the table deleted", func(c *nftables.Conn) { c.DelTable(table) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counted := snapshot(t, g).Dropped
			c := conn()
			tc.tamper(c)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			// The metric reads on, even with the rule gone, and never goes down.
			if d, err := g.Dropped(); err != nil || d != counted {
				t.Errorf("Dropped after the tampering = %d, %v; want %d", d, err, counted)
			}
			// An incremental pass trusts its view; the resync reads and repairs.
			repairs := g.Repairs()
			if err := g.Admit(at(peers...), true); err != nil {
				t.Fatal(err)
			}
			if g.Repairs() <= repairs {
				t.Errorf("Repairs = %d after the resync put things back, was %d: the repair went uncounted", g.Repairs(), repairs)
			}
			s := snapshot(t, g)
			if !s.Present || !slices.Equal(s.Admitted, peers) {
				t.Fatalf("after the resync: %+v, want present with %v", s, peers)
			}
			before := s.Dropped
			send(t, l.x, l.x.IP, l.h1.IP, 2)
			testenv.WaitFor(t, 5*time.Second, "2 more drops", func() bool { return snapshot(t, g).Dropped == before+2 })
			if before < 3 {
				t.Errorf("drop count went back to %d after the rule was put back: the metric must not go down", before)
			}
		})
	}
}

func TestGuardRemoveAndRead(t *testing.T) {
	l := newGuardLab(t)
	g := newGate(t, *l.h1, backend.IPv4)
	if err := g.Admit(at(l.h2.IP), true); err != nil {
		t.Fatal(err)
	}
	s, err := guard.Read(l.h1.NS, backend.IPv4, port)
	if err != nil || !s.Present || !slices.Equal(s.Admitted, []netip.Addr{l.h2.IP}) {
		t.Fatalf("Read = %+v, %v", s, err)
	}
	if s, err := guard.Read(l.h1.NS, backend.IPv4, port+1); err != nil || s.Present {
		t.Errorf("Read for another port = %+v, %v; want not present (the rule drops for %d)", s, err, port)
	}
	for i, want := range []bool{true, false} {
		removed, err := guard.Remove(l.h1.NS)
		if err != nil || removed != want {
			t.Fatalf("Remove #%d = %v, %v; want %v", i+1, removed, err, want)
		}
	}
	send(t, l.x, l.x.IP, l.h1.IP, 4)
	testenv.WaitFor(t, 5*time.Second, "the datagrams once the guard is removed", func() bool { return l.received[l.x.IP].Load() == 4 })
}

// A network that stops carrying IPv6 removes the IPv6 set and chain only:
// the IPv4 guard keeps its set and keeps dropping.
func TestGuardRemoveFamilyLeavesTheOther(t *testing.T) {
	l := newGuardLab(t)
	v4, v6 := newGate(t, *l.h1, backend.IPv4), newGate(t, *l.h1, backend.IPv6)
	if err := v4.Admit(at(l.h2.IP), true); err != nil {
		t.Fatal(err)
	}
	if err := v6.Admit(at(l.h2.IPv6), true); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if removed, err := guard.RemoveFamily(l.h1.NS, backend.IPv6); err != nil || removed != want {
			t.Fatalf("RemoveFamily(IPv6) #%d = %v, %v; want %v", i+1, removed, err, want)
		}
	}
	if s, err := guard.Read(l.h1.NS, backend.IPv6, port); err != nil || s.Present || len(s.Admitted) != 0 {
		t.Errorf("IPv6 after RemoveFamily: %+v, %v", s, err)
	}
	if s := snapshot(t, v4); !s.Present || !slices.Equal(s.Admitted, []netip.Addr{l.h2.IP}) {
		t.Errorf("IPv4 after the IPv6 part was removed: %+v", s)
	}
	send(t, l.x, l.x.IPv6, l.h1.IPv6, 3)
	send(t, l.x, l.x.IP, l.h1.IP, 3)
	testenv.WaitFor(t, 5*time.Second, "IPv6 datagrams through, IPv4 ones dropped", func() bool {
		return l.received[l.x.IPv6].Load() == 3 && snapshot(t, v4).Dropped == 3
	})
}

func TestGuardNewRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		fam  backend.Family
		port int
	}{{backend.IPv4, 0}, {backend.IPv4, 65536}, {backend.Family(5), port}} {
		if _, err := guard.New(tc.fam, tc.port); !errors.Is(err, guard.ErrInvalidConfig) {
			t.Errorf("New(%v, %d) = %v, want ErrInvalidConfig", tc.fam, tc.port, err)
		}
	}
}

// Datagrams to the VXLAN port that the host routes on (to a pod that uses
// UDP 8472 itself, say), or has no route for (the kernel refuses them
// itself), are not the guard's business: only those the host would
// receive itself are dropped. Both families.
func TestGuardLeavesRoutedDatagramsAlone(t *testing.T) {
	l := newGuardLab(t)
	for _, tc := range []struct {
		fam                   backend.Family
		behind, prefix, unrch netip.Prefix
		h1, h2                netip.Addr
		sysctls               []string
	}{
		{backend.IPv4, netip.MustParsePrefix("10.99.0.5/32"), netip.MustParsePrefix("10.99.0.0/24"), netip.MustParsePrefix("10.98.0.0/24"),
			l.h1.IP, l.h2.IP, []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv4/conf/all/send_redirects", "/proc/sys/net/ipv4/conf/eth0/send_redirects"}},
		{backend.IPv6, netip.MustParsePrefix("fd99::5/128"), netip.MustParsePrefix("fd99::/64"), netip.MustParsePrefix("fd98::/64"),
			l.h1.IPv6, l.h2.IPv6, []string{"/proc/sys/net/ipv6/conf/all/forwarding"}},
	} {
		t.Run(tc.fam.String(), func(t *testing.T) {
			behind := tc.behind.Addr()
			ipnet := func(p netip.Prefix) *net.IPNet {
				return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
			}
			// h2 holds behind; x reaches it through h1, which forwards, and
			// sends to unrch through h1 too, which has an unreachable route.
			withHandle(t, l.h2.NS, func(h *netlink.Handle) error {
				lo, err := h.LinkByName("lo")
				if err != nil {
					return err
				}
				if err := h.LinkSetUp(lo); err != nil {
					return err
				}
				return h.AddrAdd(lo, &netlink.Addr{IPNet: ipnet(tc.behind), Flags: unix.IFA_F_NODAD})
			})
			withHandle(t, l.h1.NS, func(h *netlink.Handle) error {
				if err := h.RouteAdd(&netlink.Route{Dst: ipnet(tc.prefix), Gw: tc.h2.AsSlice()}); err != nil {
					return err
				}
				return h.RouteAdd(&netlink.Route{Dst: ipnet(tc.unrch), Type: unix.RTN_UNREACHABLE})
			})
			withHandle(t, l.x.NS, func(h *netlink.Handle) error {
				if err := h.RouteAdd(&netlink.Route{Dst: ipnet(tc.prefix), Gw: tc.h1.AsSlice()}); err != nil {
					return err
				}
				return h.RouteAdd(&netlink.Route{Dst: ipnet(tc.unrch), Gw: tc.h1.AsSlice()})
			})
			if err := lab.Do(l.h1.NS, func() error {
				for i, p := range tc.sysctls {
					v := "0"
					if i == 0 {
						v = "1"
					}
					if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var got atomic.Int64
			conn, err := lab.ListenUDP(l.h2.NS, netip.AddrPortFrom(behind, port))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			go func() {
				buf := make([]byte, 2048)
				for {
					if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
						return
					}
					got.Add(1)
				}
			}()
			g := newGate(t, *l.h1, tc.fam)
			if err := g.Admit(nil, true); err != nil {
				t.Fatal(err)
			}
			src := l.x.IP
			if tc.fam == backend.IPv6 {
				src = l.x.IPv6
			}
			send(t, l.x, src, behind, 10)
			testenv.WaitFor(t, 5*time.Second, "10 datagrams routed through the guarded host", func() bool { return got.Load() == 10 })
			send(t, l.x, src, tc.unrch.Addr().Next(), 5)
			// h1 answers those with ICMP unreachable, not the guard: wait for
			// h1's kernel to count them, then check the guard did not.
			send(t, l.x, src, tc.h1, 1) // one it does drop, as a marker
			testenv.WaitFor(t, 5*time.Second, "the marker datagram dropped", func() bool { return snapshot(t, g).Dropped >= 1 })
			if d := snapshot(t, g).Dropped; d != 1 {
				t.Errorf("the guard counted %d drops, want 1 (the marker): routed or unroutable datagrams were dropped", d)
			}
		})
	}
}

func withHandle(t *testing.T, ns netns.NsHandle, fn func(*netlink.Handle) error) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := fn(h); err != nil {
		t.Fatal(err)
	}
}
