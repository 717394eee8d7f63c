package peerhealth

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// Socket kinds, as Open reports which one it got.
const (
	// KindDatagram is the unprivileged ICMP socket (SOCK_DGRAM,
	// IPPROTO_ICMP/ICMPV6): the kernel numbers the echo requests with
	// the socket's own identifier and hands it only the replies to them,
	// so the prober never sees (nor parses) the host's other ICMP
	// traffic. It needs the process's group in net.ipv4.ping_group_range
	// (which also rules ICMPv6 sockets).
	KindDatagram = "datagram"
	// KindRaw is the raw ICMP socket: it needs CAP_NET_RAW and receives a
	// copy of every ICMP message of the family (filtered in the kernel to
	// echo replies, and by identifier here).
	KindRaw = "raw"
)

// icmpPinger is a Pinger on one ICMP socket bound to an address and a
// device.
type icmpPinger struct {
	fam  backend.Family
	kind string
	conn net.PacketConn
	id   int // the identifier of a raw socket's requests; the kernel's on a datagram one
	once sync.Once
	buf  []byte
}

// Open opens fam's pinger: an unprivileged ICMP socket if this process
// may open one, else a raw one, bound to src (this host's VTEP address).
// It is not bound to the overlay device: a probe takes the route pod
// traffic to the peer takes, out of the overlay device (the route via the
// peer's VTEP address, onlink) or, for a DirectRouting peer on the
// underlay's subnet, over the underlay, where the device holds no
// neighbour or FDB entry for it. It opens the socket in the calling
// thread's network namespace. Neither being allowed is ErrNoSocket,
// naming what to change.
func Open(fam backend.Family, src netip.Addr) (Pinger, string, error) {
	pg, err := open(fam, src, KindDatagram)
	if err == nil {
		return pg, KindDatagram, nil
	}
	if !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EPROTONOSUPPORT) {
		return nil, "", err
	}
	pg, rerr := open(fam, src, KindRaw)
	if rerr == nil {
		return pg, KindRaw, nil
	}
	if errors.Is(rerr, unix.EACCES) || errors.Is(rerr, unix.EPERM) {
		return nil, "", noSocketError(fam, err, rerr)
	}
	return nil, "", rerr
}

func open(fam backend.Family, src netip.Addr, kind string) (_ *icmpPinger, err error) {
	af, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if fam == backend.IPv6 {
		af, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	typ := unix.SOCK_DGRAM
	if kind == KindRaw {
		typ = unix.SOCK_RAW
	}
	fd, err := unix.Socket(af, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, proto)
	if err != nil {
		return nil, fmt.Errorf("open a %s %s ICMP socket: %w", kind, fam, err)
	}
	defer func() {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}()
	if kind == KindRaw {
		// Only echo replies reach the socket.
		if fam == backend.IPv6 {
			var f unix.ICMPv6Filter
			for i := range f.Data {
				f.Data[i] = 0xffffffff // block all
			}
			t := uint8(ipv6.ICMPTypeEchoReply)
			f.Data[t>>5] &^= 1 << (t & 31)
			err = unix.SetsockoptICMPv6Filter(fd, unix.SOL_ICMPV6, unix.ICMPV6_FILTER, &f)
		} else {
			err = unix.SetsockoptInt(fd, unix.SOL_RAW, unix.ICMP_FILTER, ^(1 << uint(ipv4.ICMPTypeEchoReply)))
		}
		if err != nil {
			return nil, fmt.Errorf("filter the raw %s ICMP socket: %w", fam, err)
		}
	}
	var sa unix.Sockaddr
	if fam == backend.IPv6 {
		sa = &unix.SockaddrInet6{Addr: src.As16()}
	} else {
		sa = &unix.SockaddrInet4{Addr: src.As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return nil, fmt.Errorf("bind the %s ICMP socket to %s (this host's VTEP address): %w", fam, src, err)
	}
	f := os.NewFile(uintptr(fd), "icmp-"+kind)
	fd = -1 // f owns it
	conn, err := net.FilePacketConn(f)
	_ = f.Close() // conn has its own copy
	if err != nil {
		return nil, fmt.Errorf("%s ICMP socket: %w", fam, err)
	}
	pg := &icmpPinger{fam: fam, kind: kind, conn: conn, buf: make([]byte, 1500)}
	if kind == KindRaw {
		pg.id = int(rand.N(uint16(0xffff))) + 1
	}
	return pg, nil
}

// probePayload marks overlayd's probes in a capture.
var probePayload = []byte("overlayd peer probe")

func (p *icmpPinger) Send(dst netip.Addr, seq uint16) error {
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if p.fam == backend.IPv6 {
		typ = ipv6.ICMPTypeEchoRequest
	}
	// IPv6: the kernel fills in the checksum (it covers a pseudo-header).
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: p.id, Seq: int(seq), Data: probePayload}}).Marshal(nil)
	if err != nil {
		return err
	}
	var to net.Addr = &net.UDPAddr{IP: dst.AsSlice()}
	if p.kind == KindRaw {
		to = &net.IPAddr{IP: dst.AsSlice()}
	}
	_, err = p.conn.WriteTo(b, to)
	return err
}

func (p *icmpPinger) Receive() (netip.Addr, uint16, error) {
	for {
		n, from, err := p.conn.ReadFrom(p.buf)
		if err != nil {
			return netip.Addr{}, 0, err
		}
		seq, ok := parseReply(p.buf[:n], p.fam, p.kind == KindRaw, p.id)
		if !ok {
			continue
		}
		var addr netip.Addr
		switch a := from.(type) {
		case *net.UDPAddr:
			addr, _ = netip.AddrFromSlice(a.IP)
		case *net.IPAddr:
			addr, _ = netip.AddrFromSlice(a.IP)
		}
		return addr.Unmap(), seq, nil
	}
}

// parseReply reads the ICMP message a socket of fam received (raw: a raw
// socket, which sees every program's replies; id is then the identifier
// of this prober's requests; the IPv4 header a raw socket reads is gone
// already: net.IPConn strips it) and returns the number of the echo reply
// it holds. Anything else, malformed or another program's, is not ok.
// What arrives is untrusted: any bytes at all.
func parseReply(b []byte, fam backend.Family, raw bool, id int) (seq uint16, ok bool) {
	proto := 1 // ICMP
	if fam == backend.IPv6 {
		proto = 58 // ICMPv6
	}
	m, err := icmp.ParseMessage(proto, b)
	if err != nil {
		return 0, false
	}
	echo, isEcho := m.Body.(*icmp.Echo)
	if !isEcho || (m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply) {
		return 0, false
	}
	if raw && echo.ID != id {
		return 0, false // another program's
	}
	return uint16(echo.Seq), true
}

func (p *icmpPinger) Close() error {
	var err error
	p.once.Do(func() { err = p.conn.Close() })
	return err
}
