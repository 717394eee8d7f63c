package masq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
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
// addresses (CIDR notation; IPv6 ones without duplicate address detection,
// usable at once) and brings both up.
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
				if addr.IP.To4() == nil {
					addr.Flags |= unix.IFA_F_NODAD
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

// waitIPv6Ready waits until no IPv6 address in namespaces nss is still
// tentative: the link-local addresses veth ends get when they come up go
// through duplicate address detection, and until it ends the kernel sends
// no neighbour solicitation for a forwarded packet.
func waitIPv6Ready(t *testing.T, nss ...netns.NsHandle) {
	t.Helper()
	testenv.Eventually(t, testenv.Slack, "IPv6 duplicate address detection to end", func() error {
		for _, ns := range nss {
			var tentative error
			withLink(t, ns, func(nl *netlink.Handle) error {
				addrs, err := nl.AddrList(nil, netlink.FAMILY_V6)
				if err != nil {
					return err
				}
				for _, a := range addrs {
					if a.Flags&unix.IFA_F_DADFAILED != 0 {
						return fmt.Errorf("duplicate address detection failed for %s", a.IPNet)
					}
					if a.Flags&unix.IFA_F_TENTATIVE != 0 {
						tentative = fmt.Errorf("%s in %s is still tentative", a.IPNet, ns)
					}
				}
				return nil
			})
			if tentative != nil {
				return tentative
			}
		}
		return nil
	})
}

// enableSysctl writes "1" to the /proc/sys file path in namespace ns only
// (/proc/sys/net belongs to the namespace of the thread that opens it), and
// checks that the root namespace's value did not change.
func enableSysctl(t *testing.T, ns netns.NsHandle, path string) {
	t.Helper()
	rootBefore, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	err = lab.Do(ns, func() error {
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return err
		}
		got, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(got)) != "1" {
			err = errors.New(path + " reads " + string(got))
		}
		return err
	})
	if err != nil {
		t.Fatalf("set %s in %s: %v", path, ns, err)
	}
	if rootAfter, err := os.ReadFile(path); err != nil || string(rootAfter) != string(rootBefore) {
		t.Fatalf("the root namespace's %s changed: %q -> %q (%v)", path, rootBefore, rootAfter, err)
	}
}

// tcpNetwork returns "tcp4" or "tcp6", for a's family.
func tcpNetwork(a netip.Addr) string {
	if a.Is4() {
		return "tcp4"
	}
	return "tcp6"
}

// observedSource opens a TCP listener on dst in namespace to, connects to it
// from namespace from, and returns the source address the listener saw.
func observedSource(from, to netns.NsHandle, dst netip.Addr, timeout time.Duration) (netip.Addr, error) {
	var ln net.Listener
	if err := lab.Do(to, func() (err error) {
		ln, err = net.Listen(tcpNetwork(dst), netip.AddrPortFrom(dst, 0).String())
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
		c, err := (&net.Dialer{Timeout: timeout}).Dial(tcpNetwork(dst), ln.Addr().String())
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
// speaks netlink directly.
func setTableDormant(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	c, err := newTableRaw(t, ns, unix.NFPROTO_INET, TableName, unix.NFT_TABLE_F_DORMANT)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// addOwnedTable creates table family/name owned by the returned socket
// (NFT_TABLE_F_OWNER, Linux 5.12+): no other socket may change or delete
// it, and the kernel deletes it when the socket closes.
func addOwnedTable(t *testing.T, ns netns.NsHandle, family byte, name string) *mdnetlink.Conn {
	t.Helper()
	const ownerFlag = 2 // NFT_TABLE_F_OWNER, not in x/sys/unix
	c, err := newTableRaw(t, ns, family, name, ownerFlag)
	if errors.Is(err, unix.EOPNOTSUPP) {
		testenv.Unavailable(t, "the kernel has no owned nftables tables (Linux 5.12+): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newTableRaw sends one batch with one NEWTABLE for family/name with flags
// and returns the socket it used, open, or the kernel's answer.
func newTableRaw(t *testing.T, ns netns.NsHandle, family byte, name string, flags uint32) (*mdnetlink.Conn, error) {
	t.Helper()
	c, err := mdnetlink.Dial(unix.NETLINK_NETFILTER, &mdnetlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	attrs, err := mdnetlink.MarshalAttributes([]mdnetlink.Attribute{
		{Type: unix.NFTA_TABLE_NAME, Data: []byte(name + "\x00")},
		{Type: unix.NFTA_TABLE_FLAGS, Data: binary.BigEndian.AppendUint32(nil, flags)},
	})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	batchHdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	msgs := []mdnetlink.Message{
		{Header: mdnetlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: mdnetlink.Request}, Data: batchHdr},
		{
			Header: mdnetlink.Header{
				Type:  mdnetlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE),
				Flags: mdnetlink.Request | mdnetlink.Acknowledge | mdnetlink.Create,
			},
			Data: append([]byte{family, unix.NFNETLINK_V0, 0, 0}, attrs...),
		},
		{Header: mdnetlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: mdnetlink.Request}, Data: batchHdr},
	}
	if _, err := c.SendMessages(msgs); err != nil {
		c.Close()
		t.Fatal(err)
	}
	if _, err := c.Receive(); err != nil {
		c.Close()
		return nil, fmt.Errorf("new table %s (family %d) with flags %#x: %w", name, family, flags, err)
	}
	return c, nil
}

// withoutSysAdmin, set, makes TestEnsureWithoutCapSysAdmin the program it
// runs: New and Ensure in the namespace it was born in.
const withoutSysAdmin = "MASQ_TEST_WITHOUT_CAP_SYS_ADMIN"

// A DaemonSet pod granted NET_ADMIN and NET_RAW alone (no CAP_SYS_ADMIN,
// which entering a network namespace takes, even one's own) installs its
// table in the namespace it runs in. The test binary runs again in a test
// namespace without CAP_SYS_ADMIN in any thread (dropped from the bounding
// set before execve: capabilities are per thread, and the netlink library
// opens its sockets from a goroutine of its own).
func TestEnsureWithoutCapSysAdmin(t *testing.T) {
	if os.Getenv(withoutSysAdmin) != "" {
		m, err := New(clusterNet)
		if err == nil {
			_, err = m.Ensure()
			m.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		return
	}
	ns := newNS(t, "nosysadmin")
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnsureWithoutCapSysAdmin$", "-test.count=1")
	cmd.Env = testenv.ProgramEnv(withoutSysAdmin + "=1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	startErr := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			startErr <- err
			return
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil {
			startErr <- err
			return
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			startErr <- err
			return
		}
		data[0].Inheritable &^= 1 << unix.CAP_SYS_ADMIN
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			startErr <- err
			return
		}
		startErr <- cmd.Start()
	}()
	if err := <-startErr; err != nil {
		t.Fatalf("start the test binary without CAP_SYS_ADMIN: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("New and Ensure without CAP_SYS_ADMIN: %v\n%s", err, out.String())
	}
	tables, err := nftConn(t, ns).ListTablesOfFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || !isTable(tables[0], ourTable) {
		t.Fatalf("tables in the test namespace: %v", tables)
	}
}
