package peerhealth

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var nsSeq atomic.Int64

// newNS creates a named network namespace for t (named like the lab's, so
// a crashed run's leftovers are removed by lab.RemoveStale), deleted when
// t ends.
func newNS(t *testing.T, tag string) netns.NsHandle {
	t.Helper()
	testenv.RequireRoot(t)
	name := fmt.Sprintf("%s%d-%s", lab.RunPrefix("ph"), nsSeq.Add(1), tag)
	h, err := lab.NewNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	return h
}

// pingPair is two namespaces joined by a veth pair: pa (10.9.0.1,
// fd09::1) in a, pb (10.9.0.2, fd09::2) in b.
func pingPair(t *testing.T) (a, b netns.NsHandle) {
	t.Helper()
	a, b = newNS(t, "a"), newNS(t, "b")
	ha, err := netlink.NewHandleAt(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := netlink.NewHandleAt(b)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pa"}, PeerName: "pb", PeerNamespace: netlink.NsFd(b)}); err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		n    byte
	}{{ha, "pa", 1}, {hb, "pb", 2}} {
		link, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, cidr := range []string{fmt.Sprintf("10.9.0.%d/24", side.n), fmt.Sprintf("fd09::%d/64", side.n)} {
			addr, _ := netlink.ParseAddr(cidr)
			addr.Flags = unix.IFA_F_NODAD // usable at once
			if err := side.h.AddrAdd(link, addr); err != nil {
				t.Fatal(err)
			}
		}
		if err := side.h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// pingGroups sets net.ipv4.ping_group_range in ns.
func pingGroups(t *testing.T, ns netns.NsHandle, value string) {
	t.Helper()
	if err := lab.Do(ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte(value), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
}

// roundTrip sends one request through pg and waits for its reply.
func roundTrip(t *testing.T, pg Pinger, dst netip.Addr, seq uint16) {
	t.Helper()
	if err := pg.Send(dst, seq); err != nil {
		t.Fatalf("send to %s: %v", dst, err)
	}
	type rep struct {
		from netip.Addr
		seq  uint16
		err  error
	}
	got := make(chan rep, 1)
	go func() {
		from, s, err := pg.Receive()
		got <- rep{from, s, err}
	}()
	select {
	case r := <-got:
		if r.err != nil || r.from != dst || r.seq != seq {
			t.Fatalf("reply from %s seq %d (%v), want from %s seq %d", r.from, r.seq, r.err, dst, seq)
		}
	case <-time.After(testenv.Deadline(5 * time.Second)):
		_ = pg.Close()
		t.Fatalf("no reply from %s", dst)
	}
}

func TestSocketsProbe(t *testing.T) {
	a, _ := pingPair(t)
	for _, tc := range []struct {
		fam      backend.Family
		src, dst string
	}{{backend.IPv4, "10.9.0.1", "10.9.0.2"}, {backend.IPv6, "fd09::1", "fd09::2"}} {
		for _, kind := range []string{KindDatagram, KindRaw} {
			t.Run(tc.fam.String()+" "+kind, func(t *testing.T) {
				pingGroups(t, a, "0 2147483647")
				var pg Pinger
				if err := lab.Do(a, func() (err error) {
					pg, err = open(tc.fam, netip.MustParseAddr(tc.src), kind)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				defer pg.Close()
				roundTrip(t, pg, netip.MustParseAddr(tc.dst), 41)
				roundTrip(t, pg, netip.MustParseAddr(tc.dst), 42)
			})
		}
	}
}

func TestOpenPrefersTheUnprivilegedSocket(t *testing.T) {
	a, _ := pingPair(t)
	for _, tc := range []struct {
		groups string
		want   string
	}{
		{"0 2147483647", KindDatagram},
		{"1 0", KindRaw}, // the kernel's default: nobody may
	} {
		pingGroups(t, a, tc.groups)
		var kind string
		var pg Pinger
		if err := lab.Do(a, func() (err error) {
			pg, kind, err = Open(backend.IPv4, netip.MustParseAddr("10.9.0.1"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if kind != tc.want {
			t.Errorf("ping_group_range %q: opened a %s socket, want %s", tc.groups, kind, tc.want)
		}
		roundTrip(t, pg, netip.MustParseAddr("10.9.0.2"), 1)
		_ = pg.Close()
	}
	// An address this host does not hold is an error naming it.
	err := lab.Do(a, func() error {
		_, _, err := Open(backend.IPv4, netip.MustParseAddr("10.9.0.7"))
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "10.9.0.7") {
		t.Fatalf("open on an address not here: %v", err)
	}
}
