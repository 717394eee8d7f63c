package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rtnlConn is a route netlink socket for the requests the reconciler makes
// by the thousand — route, neighbour and FDB writes and listings — encoded
// and decoded here by hand rather than through the netlink package, whose
// per-request overhead (a getsockname, socket deadlines, a large receive
// buffer and many allocations per message) outweighs the kernel's own work
// at a cold start, where thousands of requests are made at once.
//
// Writes of one kind are sent in batches, many requests per sendmsg
// (writeBatch). rtnetlink processes the requests of one sendmsg in order,
// synchronously, and acknowledges every failed one whether asked to or not
// (netlink_rcv_skb), so only the last request of a batch asks for an
// acknowledgement: when it arrives, every error of the batch has arrived
// before it. NETLINK_CAP_ACK keeps those error messages small.
//
// Listings use a socket with NETLINK_GET_STRICT_CHK so that the kernel
// filters them (routes of the main table, neighbours of one device); they
// are filtered here as well, for kernels before 4.20.
//
// Each request (a batch, a listing) holds a mutex: the Backend serialises
// its calls, but a caller may list while a Backend runs (tests do).
type rtnlConn struct {
	mu  sync.Mutex
	f   *os.File
	rc  syscall.RawConn
	pid uint32 // our port ID: replies carry it
	seq uint32
	// kernel is where requests go. One per connection: Sendto writes
	// into it (its encoded form), so it cannot be shared.
	kernel unix.SockaddrNetlink
	wbuf   []byte
	rbuf   []byte
}

// maxBatch bounds the requests of one sendmsg: a few KiB of requests, and
// at most as many error messages queued on our socket.
const maxBatch = 128

// openRTNL opens a route netlink socket in ns.
func openRTNL(ns netns.NsHandle) (*rtnlConn, error) {
	// The netlink package knows how to open a socket in another namespace
	// safely (a locked thread, switched and switched back); take a copy of
	// its descriptor and drive it ourselves.
	s, err := socketAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	fd, err := unix.FcntlInt(uintptr(s.GetFd()), unix.F_DUPFD_CLOEXEC, 0)
	s.Close()
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	// Kernels before 4.20 lack strict checking; listings are then
	// filtered here only, which is just slower.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rtnetlink socket address: %w", err)
	}
	nsa, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		unix.Close(fd)
		return nil, errors.New("rtnetlink socket has no netlink address")
	}
	// The descriptor is non-blocking (the netlink package made it so):
	// the runtime's poller serves it and no thread blocks on it.
	f := os.NewFile(uintptr(fd), "rtnetlink")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rtnlConn{f: f, rc: rc, pid: nsa.Pid, kernel: unix.SockaddrNetlink{Family: unix.AF_NETLINK}, rbuf: make([]byte, 64<<10)}, nil
}

func (c *rtnlConn) Close() error { return c.f.Close() }

func (c *rtnlConn) send(b []byte) error {
	var serr error
	err := c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &c.kernel)
		return serr != unix.EAGAIN
	})
	if serr != nil {
		return serr
	}
	return err
}

// recv returns the next datagram (one or more messages).
func (c *rtnlConn) recv() ([]byte, error) {
	var n int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), c.rbuf, 0)
		return rerr != unix.EAGAIN
	})
	if rerr != nil {
		return nil, rerr
	}
	if err != nil {
		return nil, err
	}
	return c.rbuf[:n], nil
}

// Message encoding: appended to c.wbuf.

func (c *rtnlConn) begin(typ, flags uint16) int {
	c.seq++
	start := len(c.wbuf)
	var h [unix.NLMSG_HDRLEN]byte
	ne.PutUint16(h[4:], typ)
	ne.PutUint16(h[6:], flags|unix.NLM_F_REQUEST)
	ne.PutUint32(h[8:], c.seq)
	ne.PutUint32(h[12:], c.pid)
	c.wbuf = append(c.wbuf, h[:]...)
	return start
}

func (c *rtnlConn) end(start int) {
	ne.PutUint32(c.wbuf[start:], uint32(len(c.wbuf)-start))
}

func (c *rtnlConn) attr(typ uint16, val []byte) {
	var h [4]byte
	ne.PutUint16(h[0:], uint16(4+len(val)))
	ne.PutUint16(h[2:], typ)
	c.wbuf = append(c.wbuf, h[:]...)
	c.wbuf = append(c.wbuf, val...)
	for len(c.wbuf)%4 != 0 {
		c.wbuf = append(c.wbuf, 0)
	}
}

// attrAddr appends an address attribute: 4 bytes for IPv4, 16 for IPv6.
func (c *rtnlConn) attrAddr(typ uint16, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		c.attr(typ, b[:])
		return
	}
	b := a.As16()
	c.attr(typ, b[:])
}

func (c *rtnlConn) attrU32(typ uint16, v uint32) {
	var b [4]byte
	ne.PutUint32(b[:], v)
	c.attr(typ, b[:])
}

var ne = binary.NativeEndian

// af is the family's AF_* number.
func famAF(f Family) uint8 {
	if f == IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// appendOp encodes one write as the netlink package would have (same
// header fields and attributes), so the kernel sees the same requests.
func (c *rtnlConn) appendOp(w Write) error {
	switch w.Kind {
	case RouteReplace:
		c.appendRoute(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, unix.RTN_UNICAST, w.Route)
	case RouteDel:
		c.appendRoute(unix.RTM_DELROUTE, 0, unix.RTN_UNSPEC, w.Route)
	case NeighSet:
		n := w.Neigh
		c.appendNeigh(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, famAF(familyOf(n.IP)), n.LinkIndex, n.State, 0, n.IP, &n.MAC)
	case NeighDel:
		n := w.Neigh
		c.appendNeigh(unix.RTM_DELNEIGH, 0, famAF(familyOf(n.IP)), n.LinkIndex, 0, 0, n.IP, nil)
	case FDBSet:
		f := w.FDB
		c.appendNeigh(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, unix.AF_BRIDGE, f.LinkIndex, f.State, unix.NTF_SELF, f.Dst, &f.MAC)
	case FDBDel:
		f := w.FDB
		c.appendNeigh(unix.RTM_DELNEIGH, 0, unix.AF_BRIDGE, f.LinkIndex, f.State, unix.NTF_SELF, f.Dst, &f.MAC)
	default:
		return fmt.Errorf("vxlan: no netlink encoding for %v", w.Kind)
	}
	return nil
}

func (c *rtnlConn) appendRoute(typ, flags uint16, rtype uint8, r Route) {
	start := c.begin(typ, flags)
	var m [unix.SizeofRtMsg]byte // struct rtmsg
	m[0] = famAF(familyOf(r.Dst.Addr()))
	m[1] = uint8(r.Dst.Bits())
	m[4] = unix.RT_TABLE_MAIN
	m[5] = uint8(r.Protocol)
	m[6] = uint8(r.Scope)
	m[7] = rtype
	if r.OnLink {
		ne.PutUint32(m[8:], unix.RTNH_F_ONLINK)
	}
	c.wbuf = append(c.wbuf, m[:]...)
	c.attrAddr(unix.RTA_DST, r.Dst.Addr())
	if r.Gw.IsValid() {
		c.attrAddr(unix.RTA_GATEWAY, r.Gw)
	}
	if r.Priority > 0 {
		c.attrU32(unix.RTA_PRIORITY, uint32(r.Priority))
	}
	c.attrU32(unix.RTA_OIF, uint32(r.LinkIndex))
	c.end(start)
}

func (c *rtnlConn) appendNeigh(typ, flags uint16, family uint8, link, state int, ntf uint8, ip netip.Addr, mac *MAC) {
	start := c.begin(typ, flags)
	var m [12]byte // struct ndmsg, padding zero
	m[0] = family
	ne.PutUint32(m[4:], uint32(link))
	ne.PutUint16(m[8:], uint16(state))
	m[10] = ntf
	c.wbuf = append(c.wbuf, m[:]...)
	if ip.IsValid() {
		c.attrAddr(unix.NDA_DST, ip)
	} else {
		c.attr(unix.NDA_DST, nil)
	}
	if mac != nil {
		c.attr(unix.NDA_LLADDR, mac[:])
	}
	c.end(start)
}

// writeBatch applies ops in order, maxBatch requests per sendmsg, and
// returns each one's error (nil when it succeeded). Callers put only
// independent writes in one call: a failed write does not stop the others.
func (c *rtnlConn) writeBatch(ops []Write) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	errs := make([]error, len(ops))
	for start := 0; start < len(ops); start += maxBatch {
		chunk := ops[start:min(len(ops), start+maxBatch)]
		c.writeChunk(chunk, errs[start:start+len(chunk)])
	}
	return errs
}

func (c *rtnlConn) writeChunk(ops []Write, errs []error) {
	fail := func(err error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	c.wbuf = c.wbuf[:0]
	first := c.seq + 1
	var last int
	for _, o := range ops {
		last = len(c.wbuf)
		if err := c.appendOp(o); err != nil {
			fail(err)
			return
		}
	}
	flags := ne.Uint16(c.wbuf[last+6:])
	ne.PutUint16(c.wbuf[last+6:], flags|unix.NLM_F_ACK)
	lastSeq := c.seq
	if err := c.send(c.wbuf); err != nil {
		fail(err)
		return
	}
	for {
		b, err := c.recv()
		if err != nil {
			// Acknowledgements lost (ENOBUFS) or the socket broke: the
			// outcome of the writes not yet answered is unknown; call
			// them failed, the retry pass reads the truth back.
			fail(err)
			return
		}
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(ne.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				break
			}
			typ, seq, pid := ne.Uint16(b[4:6]), ne.Uint32(b[8:12]), ne.Uint32(b[12:16])
			if typ == unix.NLMSG_ERROR && pid == c.pid && seq >= first && seq <= lastSeq && l >= unix.NLMSG_HDRLEN+4 {
				if code := int32(ne.Uint32(b[unix.NLMSG_HDRLEN:])); code != 0 {
					errs[seq-first] = syscall.Errno(-code)
				}
				if seq == lastSeq {
					return
				}
			}
			b = b[min(len(b), nlmAlign(l)):]
		}
	}
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
