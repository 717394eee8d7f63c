package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/peerhealth"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// echoPinger answers every request at once, as a peer's VTEP would.
type echoPinger struct {
	replies chan [2]any
	closed  chan struct{}
	once    sync.Once
}

func newEchoPinger() *echoPinger {
	return &echoPinger{replies: make(chan [2]any, 64), closed: make(chan struct{})}
}

func (e *echoPinger) Send(dst netip.Addr, seq uint16) error {
	select {
	case e.replies <- [2]any{dst, seq}:
		return nil
	case <-e.closed:
		return net.ErrClosed
	}
}

func (e *echoPinger) Receive() (netip.Addr, uint16, error) {
	select {
	case r := <-e.replies:
		return r[0].(netip.Addr), r[1].(uint16), nil
	case <-e.closed:
		return netip.Addr{}, 0, net.ErrClosed
	}
}

func (e *echoPinger) Close() error { e.once.Do(func() { close(e.closed) }); return nil }

// status GETs /status (with every peer's health).
func (w *wiring) status() (Status, error) {
	var st Status
	resp, err := http.Get(w.health + "/status?peers=all")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// The prober is handed the peer set with the planes: a peer in the lease
// snapshot and one written later are both probed, from this host's VTEP
// address, and reported reachable in /status.
func TestWiringProbesThePeers(t *testing.T) {
	srv, _, _ := storeWithConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09")
	k := newFakeKernel()
	k.pinger = newEchoPinger()
	w := startWiring(t, srv, func(c *Config) {
		c.Kernel = k
		c.PeerProbe = peerhealth.Settings{Sweep: 200 * time.Millisecond}
	})
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	putLease(t, srv, "10.244.10.0-24", "198.18.0.10", "0e:00:00:00:00:0a")
	var st Status
	testenv.Eventually(t, testenv.Slack, "both peers reported reachable", func() (err error) {
		if st, err = w.status(); err != nil {
			return err
		}
		ph := st.PeerHealth
		if ph == nil || !ph.Probing || ph.IPv4.Reachable != 2 || len(ph.Peers) != 2 {
			return fmt.Errorf("peerHealth %+v", ph)
		}
		return nil
	})
	for _, p := range st.PeerHealth.Peers {
		if p.State != peerhealth.Reachable || p.VTEP != strings.TrimSuffix(p.Peer, "/24") || p.Received == 0 {
			t.Errorf("peer %+v", p)
		}
	}
	// Plain /status (what older clients read with a 1 MiB limit): the
	// summary, not every peer.
	var plain Status
	if err := getJSON(w.health+"/status", &plain); err != nil {
		t.Fatal(err)
	}
	if ph := plain.PeerHealth; ph == nil || ph.IPv4.Reachable != 2 || len(ph.Peers) != 0 {
		t.Errorf("plain /status peerHealth %+v, want the summary without the peers", ph)
	}
	// The gauges, from one Counts a scrape.
	resp, err := http.Get(w.health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`overlay_peers_reachable{family="ipv4"} 2`, `overlay_peers_unreachable{family="ipv4"} 0`, `overlay_peers_reachable{family="ipv6"} 0`} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	own := netip.MustParsePrefix(st.Subnet).Addr()
	k.mu.Lock()
	from := slices.Clone(k.pingedFrom)
	k.mu.Unlock()
	if want := []string{"IPv4 " + own.String()}; !slices.Equal(from, want) {
		t.Errorf("pinger opened %q, want %q (this host's VTEP address)", from, want)
	}
}

// Without an ICMP socket the daemon runs on and is ready; /status says
// why its peers are not probed.
func TestWiringRunsOnWithoutAnICMPSocket(t *testing.T) {
	srv, _, _ := storeWithConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	putLease(t, srv, "10.244.9.0-24", "198.18.0.9", "0e:00:00:00:00:09")
	w := startWiring(t, srv)
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	testenv.Eventually(t, testenv.Slack, "/status to say why the peers are not probed", func() error {
		st, err := w.status()
		if err != nil {
			return err
		}
		if ph := st.PeerHealth; ph == nil || ph.Probing || len(ph.Problems) != 1 || !strings.Contains(ph.Problems[0], "no ICMP socket allowed") {
			return fmt.Errorf("peerHealth %+v", st.PeerHealth)
		}
		return nil
	})
	if err := w.ready(); err != nil {
		t.Fatalf("not ready without an ICMP socket: %v", err)
	}
}

// --peer-probe=false: no socket is opened and /status has no peerHealth.
func TestWiringWithoutProbing(t *testing.T) {
	srv, _, _ := storeWithConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	k := newFakeKernel()
	k.pinger = newEchoPinger()
	w := startWiring(t, srv, func(c *Config) { c.Kernel = k; c.NoPeerProbe = true })
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	st, err := w.status()
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if st.PeerHealth != nil || len(k.pingedFrom) != 0 {
		t.Errorf("probing off, yet peerHealth %+v and sockets opened %q", st.PeerHealth, k.pingedFrom)
	}
}
