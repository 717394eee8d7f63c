package kubee2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// prober sends a numbered UDP datagram every 50 ms (20/s) from a pod to
// another pod's kube-echo (which answers with the payload) and records
// which numbers came back.
type prober struct {
	name string
	conn *net.UDPConn
	dst  netip.AddrPort
	mu   sync.Mutex
	sent int
	got  map[int]bool
	stop chan struct{}
	wg   sync.WaitGroup
}

func (m *matrix) newProber(t *testing.T, from, to string) *prober {
	t.Helper()
	ns, err := m.c.podNS(m.pods[from])
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	conn, err := lab.ListenUDP(ns, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	if err != nil {
		t.Fatal(err)
	}
	p := &prober{name: from + " -> " + to, conn: conn, dst: netip.AddrPortFrom(m.pods[to].IP, 8081), got: map[int]bool{}, stop: make(chan struct{})}
	p.wg.Go(p.receive)
	p.wg.Go(p.send)
	return p
}

func (p *prober) send() {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		seq := p.sent
		p.sent++
		p.mu.Unlock()
		_, _ = p.conn.WriteToUDPAddrPort([]byte(strconv.Itoa(seq)), p.dst)
	}
}

func (p *prober) receive() {
	buf := make([]byte, 2048)
	for {
		n, _, err := p.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var r echoReply
		if json.Unmarshal(buf[:n], &r) != nil {
			continue
		}
		if seq, err := strconv.Atoi(r.Data); err == nil {
			p.mu.Lock()
			p.got[seq] = true
			p.mu.Unlock()
		}
	}
}

// answered reports how many of the last n datagrams sent were answered.
func (p *prober) answeredOfLast(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := 0
	for seq := max(0, p.sent-n-20); seq < p.sent-20; seq++ { // the last second may be in flight
		if p.got[seq] {
			k++
		}
	}
	return k
}

// finish stops sending, waits a second for the answers in flight, and
// returns the numbers that never came back (after the first one that did:
// the path was being set up before).
func (p *prober) finish() (sent int, lost []int) {
	close(p.stop)
	time.Sleep(time.Second)
	p.conn.Close()
	p.wg.Wait()
	first := -1
	for seq := 0; seq < p.sent; seq++ {
		if p.got[seq] {
			first = seq
			break
		}
	}
	for seq := max(first, 0); seq < p.sent; seq++ {
		if !p.got[seq] {
			lost = append(lost, seq)
		}
	}
	return p.sent, lost
}

// rollingUpdate changes the DaemonSet's image to a new tag and waits for
// every node to run it, while pods on every node probe pods on other
// nodes at 20 datagrams a second: overlayd's restart leaves the data path
// in place, so not one may be lost.
func (m *matrix) rollingUpdate(t *testing.T) {
	c := m.c
	probers := []*prober{
		m.newProber(t, "a-k1", "b-k2"),
		m.newProber(t, "a-k2", "b-k3"),
		m.newProber(t, "a-k3", "b-k1"),
	}
	stopped := false
	defer func() {
		if !stopped {
			for _, p := range probers {
				p.finish()
			}
		}
	}()
	testenv.Eventually(t, time.Minute, "every prober to be answered 20 times in a row", func() error {
		for _, p := range probers {
			if k := p.answeredOfLast(20); k != 20 {
				return fmt.Errorf("%s: %d of the last 20 answered", p.name, k)
			}
		}
		return nil
	})
	start := time.Now()
	if out, err := c.kubectl(context.Background(), nil, "-n", "overlay-system", "set", "image", "daemonset/overlayd",
		"install-cni="+overlayImage2, "overlayd="+overlayImage2); err != nil {
		t.Fatalf("kubectl set image: %v\n%s", err, out)
	}
	c.waitDaemonSet(overlayImage2)
	took := time.Since(start)
	time.Sleep(2 * time.Second) // traffic after the last restart, too
	stopped = true
	for _, p := range probers {
		sent, lost := p.finish()
		if len(lost) > 0 {
			t.Errorf("rolling update: %s lost %d of %d datagrams: %v", p.name, len(lost), sent, lost)
		} else {
			t.Logf("rolling update: %s: %d datagrams at 20/s, none lost", p.name, sent)
		}
	}
	t.Logf("rolling update of the overlayd DaemonSet to %s: every node ready with it %s after kubectl set image", overlayImage2, took.Round(100*time.Millisecond))
}
