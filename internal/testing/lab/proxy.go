package lab

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// ProxyMode is what a Proxy does with the bytes of its connections.
type ProxyMode int

const (
	// ProxyUp forwards every connection.
	ProxyUp ProxyMode = iota
	// ProxyDown closes every connection, and every new one at once: to its
	// clients the server behind it is gone (like a stopped etcd, but the
	// server keeps running for the test's own client).
	ProxyDown
	// ProxyFrozen stops forwarding on the connections open at the time,
	// without closing them: a silently dead TCP connection (a host that
	// vanished, a blackholing firewall). New connections are forwarded.
	ProxyFrozen
	// ProxyBlackhole accepts connections and never forwards anything, on
	// old and new connections alike: a member that is unreachable but
	// whose connections never fail.
	ProxyBlackhole
)

func (m ProxyMode) String() string {
	switch m {
	case ProxyUp:
		return "up"
	case ProxyDown:
		return "down"
	case ProxyFrozen:
		return "frozen"
	case ProxyBlackhole:
		return "blackhole"
	}
	return fmt.Sprintf("ProxyMode(%d)", int(m))
}

// Proxy is a byte-level (layer 4) proxy on a unix socket in front of a
// server (an etcd member's unix socket), for faults the server cannot be
// made to show: its clients can be cut off while the server runs, or left
// with connections that stay open and go silent. It runs in the test's
// process; a unix socket is reachable from every network namespace.
type Proxy struct {
	path   string
	target string // the server's etcd endpoint URL (guarded by mu)
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	mode   ProxyMode
	conns  map[*proxyConn]bool
	closed bool
	delay  time.Duration // of what the server sends
}

// proxyConn is one client connection and its upstream.
type proxyConn struct {
	client, server net.Conn
	frozen         chan struct{} // closed when this connection is frozen
	done           chan struct{} // closed when it is closed
	freezeOnce     sync.Once
	closeOnce      sync.Once
}

func (c *proxyConn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		_ = c.client.Close()
		if c.server != nil {
			_ = c.server.Close()
		}
	})
}

func (c *proxyConn) freeze() { c.freezeOnce.Do(func() { close(c.frozen) }) }

// NewProxy listens on the unix socket path and forwards to target, an etcd
// endpoint URL (unix:///path or http://host:port). Its own endpoint for an
// etcd client is "unix://" + path.
func NewProxy(path, target string) (*Proxy, error) {
	if _, _, err := splitEndpoint(target); err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: %w", target, err)
	}
	p := &Proxy{path: path, target: target, ln: ln, conns: map[*proxyConn]bool{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Endpoint is the proxy's etcd client URL.
func (p *Proxy) Endpoint() string { return "unix://" + p.path }

// Mode returns the current mode.
func (p *Proxy) Mode() ProxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches the proxy to mode m. Down closes every open connection;
// Frozen and Blackhole freeze them; Up lets new connections through
// (connections frozen before stay frozen: their clients must notice).
func (p *Proxy) Set(m ProxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	for c := range p.conns {
		switch m {
		case ProxyDown:
			c.close()
			delete(p.conns, c)
		case ProxyFrozen, ProxyBlackhole:
			c.freeze()
		}
	}
}

// Retarget closes every open connection and forwards new ones to target:
// to its clients the server behind the same address was replaced (an etcd
// wiped and started again, or restored from a backup).
func (p *Proxy) Retarget(target string) error {
	if _, _, err := splitEndpoint(target); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.close()
		delete(p.conns, c)
	}
	return nil
}

// SetAnswerDelay delays everything the server sends its clients by d, on
// open and new connections: a server that is slow to answer (overloaded)
// but not gone. 0 forwards at once again.
func (p *Proxy) SetAnswerDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// AnswerDelay is the delay set by SetAnswerDelay.
func (p *Proxy) AnswerDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// Conns is the number of client connections open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the proxy and closes every connection; safe to call twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		c := &proxyConn{client: client, frozen: make(chan struct{}), done: make(chan struct{})}
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		if !closed && mode != ProxyDown {
			p.conns[c] = true
		}
		p.mu.Unlock()
		switch {
		case closed || mode == ProxyDown:
			_ = client.Close()
			continue
		case mode == ProxyBlackhole:
			c.freeze()
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(c *proxyConn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.close()
	}()
	select {
	case <-c.frozen:
		// Blackholed: held open, nothing forwarded, what the client sends
		// dropped; closed once the client gives up, so clients retrying
		// into a long blackhole do not pile up open connections here.
		_, _ = io.Copy(io.Discard, c.client)
		return
	default:
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	network, addr, _ := splitEndpoint(target)
	server, err := net.Dial(network, addr)
	if err != nil {
		return // the server is down: the client sees its connection close
	}
	p.mu.Lock()
	if p.closed || !p.conns[c] {
		p.mu.Unlock()
		_ = server.Close()
		return
	}
	c.server = server
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { pump(c, server, c.client, func() time.Duration { return 0 }) })
	wg.Go(func() { pump(c, c.client, server, p.AnswerDelay) })
	wg.Wait()
}

// pump copies from src to dst, each chunk delay() after it was read, until
// either side fails or the connection is frozen. A frozen connection
// forwards nothing more and stays open until the proxy closes it (Down,
// Close): its peers see silence, not an error.
func pump(c *proxyConn, dst, src net.Conn, delay func() time.Duration) {
	type chunk struct {
		b   []byte
		at  time.Time
		err error
	}
	// The reader stamps each chunk as it arrives, so that a delay is a
	// latency, not a limit on throughput; it ends when src is closed.
	q := make(chan chunk, 64)
	go func() {
		defer close(q)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case q <- chunk{bytes.Clone(buf[:n]), time.Now(), err}:
			case <-c.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range q {
		if wait := time.Until(ch.at.Add(delay())); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
		select {
		case <-c.frozen:
			<-c.done
			return
		default:
		}
		if len(ch.b) > 0 {
			if _, werr := dst.Write(ch.b); werr != nil {
				c.close()
				return
			}
		}
		if ch.err != nil {
			if errors.Is(ch.err, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite() // pass the half-close on
					return
				}
			}
			c.close()
			return
		}
	}
}

// splitEndpoint turns an etcd endpoint URL into a network and address.
func splitEndpoint(ep string) (network, addr string, err error) {
	if rest, ok := strings.CutPrefix(ep, "unix://"); ok {
		return "unix", rest, nil
	}
	if rest, ok := strings.CutPrefix(ep, "http://"); ok {
		return "tcp", rest, nil
	}
	return "", "", fmt.Errorf("proxy: endpoint %q: want unix:///path or http://host:port", ep)
}
