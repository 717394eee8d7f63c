package lab

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ProbePort is where every pod's Responder listens, on TCP and UDP.
const ProbePort = 7777

// Every probe socket is created on a thread switched into the namespace it
// probes from (Do), so it belongs to that namespace for its whole life and
// can then be used from any goroutine.

// DialTCP connects from namespace ns to dst.
func DialTCP(ns netns.NsHandle, dst netip.AddrPort, timeout time.Duration) (conn net.Conn, err error) {
	err = Do(ns, func() error {
		conn, err = (&net.Dialer{Timeout: timeout}).Dial(family("tcp", dst.Addr()), dst.String())
		return err
	})
	return conn, err
}

// ListenTCP listens in namespace ns.
func ListenTCP(ns netns.NsHandle, addr netip.AddrPort) (ln net.Listener, err error) {
	err = Do(ns, func() error {
		ln, err = net.Listen(family("tcp", addr.Addr()), addr.String())
		return err
	})
	return ln, err
}

// family is network ("tcp", "udp") for a's address family only ("tcp4",
// "tcp6"), so an unspecified address never binds both families.
func family(network string, a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return network + "6"
	}
	return network + "4"
}

// ListenUDP opens a UDP socket in namespace ns.
func ListenUDP(ns netns.NsHandle, addr netip.AddrPort) (conn *net.UDPConn, err error) {
	err = Do(ns, func() error {
		conn, err = net.ListenUDP(family("udp", addr.Addr()), net.UDPAddrFromAddrPort(addr))
		return err
	})
	return conn, err
}

// Responder answers probes in a namespace: a TCP connection gets the
// address it came from, as the responder saw it (so a test can tell whether
// anything NATed it), and is closed; a UDP datagram is echoed back.
type Responder struct {
	tcp  net.Listener
	udp  *net.UDPConn
	wg   sync.WaitGroup
	once sync.Once
}

// Serve starts a Responder on addr:port (TCP and UDP) in namespace ns.
func Serve(ns netns.NsHandle, addr netip.Addr, port uint16) (*Responder, error) {
	ap := netip.AddrPortFrom(addr, port)
	tcp, err := ListenTCP(ns, ap)
	if err != nil {
		return nil, fmt.Errorf("responder: listen on tcp %s: %w", ap, err)
	}
	udp, err := ListenUDP(ns, ap)
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("responder: listen on udp %s: %w", ap, err)
	}
	r := &Responder{tcp: tcp, udp: udp}
	r.wg.Go(r.serveTCP)
	r.wg.Go(r.serveUDP)
	return r, nil
}

func (r *Responder) serveTCP() {
	for {
		conn, err := r.tcp.Accept()
		if err != nil {
			return // closed
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "%s\n", conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
		conn.Close()
	}
}

func (r *Responder) serveUDP() {
	buf := make([]byte, 2048)
	for {
		n, from, err := r.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = r.udp.WriteToUDPAddrPort(buf[:n], from)
	}
}

// Close stops the responder and waits for it.
func (r *Responder) Close() {
	r.once.Do(func() {
		r.tcp.Close()
		r.udp.Close()
		r.wg.Wait()
	})
}

// WhoAmI connects from namespace ns to the Responder at dst and returns the
// source address the responder saw.
func WhoAmI(ns netns.NsHandle, dst netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	conn, err := DialTCP(ns, dst, timeout)
	if err != nil {
		return netip.Addr{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read from responder %s: %w", dst, err)
	}
	seen, err := netip.ParseAddr(strings.TrimSpace(line))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("responder %s answered %q: %w", dst, line, err)
	}
	return seen, nil
}

// pingID makes the ICMP echo identifiers of concurrent pings distinct: every
// raw ICMP socket of a namespace sees every echo reply.
var pingID atomic.Uint32

func init() { pingID.Store(uint32(os.Getpid()) << 4) }

// Ping sends one ICMP (or ICMPv6) echo request from namespace ns to dst and
// returns the round-trip time of the reply.
func Ping(ns netns.NsHandle, dst netip.Addr, timeout time.Duration) (time.Duration, error) {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var echo, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		echo, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var conn *icmp.PacketConn
	if err := Do(ns, func() (err error) {
		conn, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return 0, fmt.Errorf("icmp socket: %w", err)
	}
	defer conn.Close()
	id := int(uint16(pingID.Add(1)))
	payload := make([]byte, 32)
	copy(payload, "overlay lab ping")
	msg := icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: 1, Data: payload}}
	wire, err := msg.Marshal(nil) // the kernel fills in the ICMPv6 checksum
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(timeout)
	_ = conn.SetDeadline(deadline)
	start := time.Now()
	if _, err := conn.WriteTo(wire, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return 0, fmt.Errorf("ping %s: %w", dst, err)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return 0, fmt.Errorf("ping %s: no reply: %w", dst, err)
		}
		rtt := time.Since(start)
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != reply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != id || e.Seq != 1 {
			continue
		}
		if ip, ok := from.(*net.IPAddr); !ok || !ip.IP.Equal(dst.AsSlice()) {
			continue
		}
		return rtt, nil
	}
}

// Stream sends a UDP probe to a Responder at a fixed rate and counts the
// replies: a probe is lost when its echo does not come back within the
// timeout.
type Stream struct {
	conn     *net.UDPConn
	dst      netip.AddrPort
	interval time.Duration
	timeout  time.Duration
	start    time.Time
	stop     chan struct{}
	wg       sync.WaitGroup // the receiver
	sending  sync.WaitGroup // the sender

	mu    sync.Mutex
	sent  map[uint64]time.Time // seq -> when sent, until answered
	stats StreamStats
}

// StreamStats counts a Stream's probes.
type StreamStats struct {
	Sent, Received int
	Late           int             // answered after the timeout (counted as lost)
	Lost           []time.Duration // when each lost probe was sent, since the stream started
	SendErrors     int             // sends the kernel refused (counted as lost)
	FirstSendError string          // why the first refused send was refused
	MaxRTT         time.Duration
}

func (s StreamStats) String() string {
	str := fmt.Sprintf("%d sent, %d answered, %d lost, %d send errors, max RTT %s", s.Sent, s.Received, len(s.Lost), s.SendErrors, s.MaxRTT.Round(time.Microsecond))
	if s.FirstSendError != "" {
		str += " (first send error: " + s.FirstSendError + ")"
	}
	if len(s.Lost) > 0 {
		const show = 10
		var at []string
		for i, d := range s.Lost {
			if i == show {
				at = append(at, "...")
				break
			}
			at = append(at, d.Round(time.Millisecond).String())
		}
		str += " (lost probes sent at " + strings.Join(at, ", ") + ")"
	}
	return str
}

const streamMagic = 0x6f766c70726f6265 // "ovlprobe"

// StartStream starts probing dst from namespace ns every interval.
func StartStream(ns netns.NsHandle, dst netip.AddrPort, interval, timeout time.Duration) (*Stream, error) {
	any := netip.IPv4Unspecified()
	if dst.Addr().Is6() {
		any = netip.IPv6Unspecified()
	}
	conn, err := ListenUDP(ns, netip.AddrPortFrom(any, 0))
	if err != nil {
		return nil, fmt.Errorf("probe stream socket: %w", err)
	}
	s := &Stream{conn: conn, dst: dst, interval: interval, timeout: timeout, start: time.Now(),
		stop: make(chan struct{}), sent: map[uint64]time.Time{}}
	s.sending.Go(s.send)
	s.wg.Go(s.receive)
	return s, nil
}

func (s *Stream) send() {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	buf := make([]byte, 16)
	binary.BigEndian.PutUint64(buf, streamMagic)
	for seq := uint64(1); ; seq++ {
		binary.BigEndian.PutUint64(buf[8:], seq)
		now := time.Now()
		s.expire(now)
		s.mu.Lock()
		s.stats.Sent++
		if _, err := s.conn.WriteToUDPAddrPort(buf, s.dst); err != nil {
			s.stats.SendErrors++
			if s.stats.FirstSendError == "" {
				s.stats.FirstSendError = err.Error()
			}
			s.stats.Lost = append(s.stats.Lost, now.Sub(s.start))
		} else {
			s.sent[seq] = now
		}
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// expire counts the probes unanswered for longer than the timeout as lost.
func (s *Stream) expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, at := range s.sent {
		if now.Sub(at) > s.timeout {
			s.stats.Lost = append(s.stats.Lost, at.Sub(s.start))
			delete(s.sent, seq)
		}
	}
}

func (s *Stream) receive() {
	buf := make([]byte, 64)
	for {
		n, _, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		now := time.Now()
		if n != 16 || binary.BigEndian.Uint64(buf) != streamMagic {
			continue
		}
		seq := binary.BigEndian.Uint64(buf[8:])
		s.mu.Lock()
		if at, ok := s.sent[seq]; ok {
			delete(s.sent, seq)
			if rtt := now.Sub(at); rtt > s.timeout {
				s.stats.Late++
				s.stats.Lost = append(s.stats.Lost, at.Sub(s.start))
			} else {
				s.stats.Received++
				s.stats.MaxRTT = max(s.stats.MaxRTT, rtt)
			}
		}
		s.mu.Unlock()
	}
}

// Stats returns the counts so far (probes in flight are neither answered
// nor lost yet).
func (s *Stream) Stats() StreamStats {
	s.expire(time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Lost = append([]time.Duration(nil), st.Lost...)
	return st
}

// Stop stops sending, waits for the answers still in flight (up to the
// timeout) and returns the final counts.
func (s *Stream) Stop() StreamStats {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	// The sender must be done before the socket closes: a probe sent
	// into a closed socket would count as lost though nothing dropped it.
	s.sending.Wait()
	deadline := time.Now().Add(s.timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		pending := len(s.sent)
		s.mu.Unlock()
		if pending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.conn.Close()
	s.wg.Wait()
	s.expire(time.Now().Add(s.timeout + time.Nanosecond)) // whatever is still out is lost
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	slices.Sort(st.Lost)
	return st
}
