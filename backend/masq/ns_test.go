package masq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	nsSeq        atomic.Int64
	staleRemoved sync.Once
)

// newNS creates a named network namespace for t (named like internal/lab's,
// so a crashed run's leftovers are removed by lab.RemoveStale) without
// moving the caller, and deletes it when t ends.
func newNS(t *testing.T, tag string) netns.NsHandle {
	t.Helper()
	testenv.RequireRoot(t)
	staleRemoved.Do(func() {
		if err := lab.RemoveStale(); err != nil {
			t.Logf("removing stale lab namespaces: %v", err)
		}
	})
	name := fmt.Sprintf("%s%d-%s", lab.RunPrefix("masq"), nsSeq.Add(1), tag)
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
	withLink(t, h, func(nl *netlink.Handle) error {
		lo, err := nl.LinkByName("lo")
		if err != nil {
			return err
		}
		return nl.LinkSetUp(lo)
	})
	return h
}

// withLink runs fn with a netlink handle inside ns.
func withLink(t *testing.T, ns netns.NsHandle, fn func(*netlink.Handle) error) {
	t.Helper()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns, err)
	}
	defer nl.Close()
	if err := fn(nl); err != nil {
		t.Fatal(err)
	}
}

// nftConn returns a google/nftables connection into ns, for tampering.
func nftConn(t *testing.T, ns netns.NsHandle) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatalf("nftables in %s: %v", ns, err)
	}
	return c
}

// gen returns the ruleset generation of ns: it moves with every committed
// nftables transaction, so an unchanged value proves no write happened.
func gen(t *testing.T, ns netns.NsHandle) uint32 {
	t.Helper()
	g, err := generation(ns, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// veth connects namespaces a and b with a veth pair, gives each end its
// addresses (CIDR notation) and brings both up.
func veth(t *testing.T, a netns.NsHandle, aName string, aAddrs []string, b netns.NsHandle, bName string, bAddrs []string) {
	t.Helper()
	withLink(t, a, func(nl *netlink.Handle) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(b)}
		if err := nl.LinkAdd(v); err != nil {
			return fmt.Errorf("veth %s/%s: %w", aName, bName, err)
		}
		return nil
	})
	for _, end := range []struct {
		ns    netns.NsHandle
		name  string
		addrs []string
	}{{a, aName, aAddrs}, {b, bName, bAddrs}} {
		withLink(t, end.ns, func(nl *netlink.Handle) error {
			link, err := nl.LinkByName(end.name)
			if err != nil {
				return err
			}
			for _, s := range end.addrs {
				addr, err := netlink.ParseAddr(s)
				if err != nil {
					return err
				}
				if err := nl.AddrAdd(link, addr); err != nil {
					return fmt.Errorf("%s: address %s: %w", end.name, s, err)
				}
			}
			return nl.LinkSetUp(link)
		})
	}
}

// route adds dst (CIDR) in ns, via gw (on-link: no connected route needed)
// if valid, else directly on dev.
func route(t *testing.T, ns netns.NsHandle, dst string, gw netip.Addr, dev string) {
	t.Helper()
	withLink(t, ns, func(nl *netlink.Handle) error {
		_, ipn, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		link, err := nl.LinkByName(dev)
		if err != nil {
			return err
		}
		r := &netlink.Route{Dst: ipn, LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK}
		if gw.IsValid() {
			r.Gw, r.Scope, r.Flags = gw.AsSlice(), netlink.SCOPE_UNIVERSE, int(netlink.FLAG_ONLINK)
		}
		if err := nl.RouteAdd(r); err != nil {
			return fmt.Errorf("route %s via %v dev %s: %w", dst, gw, dev, err)
		}
		return nil
	})
}

// observedSource opens a TCP listener on dst in namespace to, connects to it
// from namespace from, and returns the source address the listener saw.
func observedSource(from, to netns.NsHandle, dst netip.Addr, timeout time.Duration) (netip.Addr, error) {
	var ln net.Listener
	if err := lab.Do(to, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		return netip.Addr{}, fmt.Errorf("listen on %s: %w", dst, err)
	}
	defer ln.Close()
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(timeout)); err != nil {
		return netip.Addr{}, err
	}
	type result struct {
		src netip.Addr
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- result{err: err}
			return
		}
		defer c.Close()
		accepted <- result{src: c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()}
	}()
	err := lab.Do(from, func() error {
		c, err := (&net.Dialer{Timeout: timeout}).Dial("tcp4", ln.Addr().String())
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		ln.Close() // unblock Accept
		<-accepted
		return netip.Addr{}, fmt.Errorf("connect to %s: %w", ln.Addr(), err)
	}
	r := <-accepted
	return r.src, r.err
}

// setTableDormant sets the dormant flag on our table (its chains stop
// seeing packets). google/nftables always sends table flags 0, so this
// speaks netlink directly: one batch with one NEWTABLE.
func setTableDormant(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	c, err := mdnetlink.Dial(unix.NETLINK_NETFILTER, &mdnetlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	attrs, err := mdnetlink.MarshalAttributes([]mdnetlink.Attribute{
		{Type: unix.NFTA_TABLE_NAME, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_TABLE_FLAGS, Data: binary.BigEndian.AppendUint32(nil, unix.NFT_TABLE_F_DORMANT)},
	})
	if err != nil {
		t.Fatal(err)
	}
	batchHdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	msgs := []mdnetlink.Message{
		{Header: mdnetlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: mdnetlink.Request}, Data: batchHdr},
		{
			Header: mdnetlink.Header{
				Type:  mdnetlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE),
				Flags: mdnetlink.Request | mdnetlink.Acknowledge,
			},
			Data: append([]byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0}, attrs...),
		},
		{Header: mdnetlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: mdnetlink.Request}, Data: batchHdr},
	}
	if _, err := c.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Receive(); err != nil {
		t.Fatalf("set table ip %s dormant: %v", TableName, err)
	}
}
