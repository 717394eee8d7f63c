package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// injectPort is where the target pod counts the datagrams injected into it.
const injectPort = 7789

// The VXLAN guard (on by default) on a cluster of two overlayd hosts and a
// host as flanneld leaves it: a host on the underlay that holds no lease
// sends well-formed VXLAN datagrams (the right VNI, the target host's VTEP
// MAC, an inner UDP packet to a pod with a spoofed pod source) and the pod
// receives none of them while the host's drop counter rises by exactly as
// many; the same datagrams sent from a host that holds a lease reach the
// pod, so they are well-formed. Meanwhile pods of real peers, the flanneld
// host's included, lose no probe at 20 a second, also while a fourth host
// joins and leaves; the leaving host's address leaves the guard's set, and
// its teardown removes its guard; a host restarted with
// --vxlan-guard=false removes its own.
func TestVXLANGuardDropsInjectedFramesAndAdmitsPeers(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	ctx := ctxT(t, 3*time.Minute)
	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// h2 is flanneld's: its lease first, its data path once h1's and h3's
	// leases are known (as migrate_test.go builds it).
	h2, fl, grant := flannelLeaseHolder(ctx, t, l, cli)
	h1 := labtest.StartHost(t, l, "h1", 1)
	h3 := labtest.StartHost(t, l, "h3", 3)
	labtest.WaitReady(t, h1)
	labtest.WaitReady(t, h3)
	var h1MAC net.HardwareAddr
	for _, n := range []*lab.Node{h1, h3} {
		row, ok := leaseRow(t, l, n.Name)
		if !ok {
			t.Fatalf("%s has no lease", n.Name)
		}
		mac, err := net.ParseMAC(row.VtepMAC)
		if err != nil {
			t.Fatal(err)
		}
		if n == h1 {
			h1MAC = mac
		}
		fl.Peers = append(fl.Peers, flannelhost.Peer{Subnet: lease(t, n), PublicIP: n.IP, VtepMAC: mac})
	}
	if _, err := cli.Revoke(ctx, grant); err != nil { // Build writes the lease again
		t.Fatal(err)
	}
	if _, err := fl.Build(ctx, h2.NS, cli, etcdv3.DefaultPrefix); err != nil {
		t.Fatal(err)
	}
	flPod, err := h2.AddPodWith(ctx, "fl", flannelConfList(t, fl.PodConfig("cbr0", filepath.Join(h2.Dir, "ipam"))))
	if err != nil {
		t.Fatal(err)
	}
	p1, p3 := labtest.AddPod(t, h1, "p1"), labtest.AddPod(t, h3, "p1")

	// The flanneld host is admitted: its pod and h1's reach each other.
	labtest.Eventually(t, settle, "pods of h1, h3 and the flanneld host to reach each other", func() error {
		return errors.Join(reach(p1, flPod), reach(flPod, p1), reach(p3, p1), reach(p1, p3))
	})
	if s, err := guard.Read(h1.NS, backend.IPv4, 8472); err != nil || !s.Present || !slices.Equal(s.Admitted, []netip.Addr{h2.IP, h3.IP}) {
		t.Fatalf("h1's guard: %+v, %v; want present, admitting [%s %s]", s, err, h2.IP, h3.IP)
	}

	// Real peers' pods probe h1's pod 20 times a second throughout.
	var streams []*lab.Stream
	for _, from := range []*lab.Pod{p3, flPod} {
		s, err := lab.StartStream(from.NS, netip.AddrPortFrom(p1.IP, lab.ProbePort), streamInterval, streamTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		warmUp(t, s, 5)
		streams = append(streams, s)
	}

	// p1 counts what reaches it on injectPort.
	var got atomic.Int64
	conn, err := lab.ListenUDP(p1.NS, netip.AddrPortFrom(p1.IP, injectPort))
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
	// Spoofed: the inner packet claims to come from h3's pod.
	frame := vxlanFrame(1, h1MAC, p3.IP, p1.IP, injectPort)

	// The control: from h3, which holds a lease, the frames reach the pod.
	injectVXLAN(t, h3.Host, h3.IP, h1.IP, frame, 10)
	labtest.Eventually(t, settle, "the 10 frames sent from a peer to reach the pod", func() error {
		if n := got.Load(); n != 10 {
			return fmt.Errorf("the pod got %d", n)
		}
		return nil
	})
	dropped0 := guardDropped(t, h1)

	// The attack: a host on the underlay that holds no lease.
	x, err := l.Underlay.AddHost("x", 9)
	if err != nil {
		t.Fatal(err)
	}
	const attempts = 200
	injectVXLAN(t, x, x.IP, h1.IP, frame, attempts)
	labtest.Eventually(t, settle, "h1's guard to count the injected frames", func() error {
		if d := guardDropped(t, h1) - dropped0; d != attempts {
			return fmt.Errorf("dropped %d more, want %d", d, attempts)
		}
		return nil
	})
	if n := got.Load(); n != 10 {
		t.Errorf("the pod received %d injected frames from a host without a lease", n-10)
	}

	// A host joins and leaves under the probes; its address comes and goes.
	h4 := labtest.StartHost(t, l, "h4", 4)
	labtest.WaitReady(t, h4)
	p4 := labtest.AddPod(t, h4, "p1")
	labtest.Eventually(t, settle, "h4's pod and h1's to reach each other", func() error {
		// (not the flanneld host's: no flanneld runs there to add h4)
		return errors.Join(reach(p4, p1), reach(p1, p4))
	})
	if err := h4.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out, err := h4.Teardown(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatalf("teardown h4: %v", err)
	}
	if s, err := guard.Read(h4.NS, backend.IPv4, 8472); err != nil || s.Present || !strings.Contains(out, "removed nftables table inet "+guard.TableName) {
		t.Errorf("after overlayd teardown on h4: its guard %+v (%v); teardown said:\n%s", s, err, out)
	}
	labtest.Eventually(t, settle, "h4's address to leave h1's guard", func() error {
		s, err := guard.Read(h1.NS, backend.IPv4, 8472)
		if err != nil || !slices.Equal(s.Admitted, []netip.Addr{h2.IP, h3.IP}) {
			return fmt.Errorf("h1's guard admits %v (%v)", s.Admitted, err)
		}
		return nil
	})
	// h3 restarted with --vxlan-guard=false removes its guard table (a
	// table nobody keeps would drop every host that joins later), and
	// its pod's probes go on: h1's guard still admits h3.
	h3.ExtraArgs = []string{"--vxlan-guard=false"}
	if err := h3.Restart(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h3)
	if s, err := guard.Read(h3.NS, backend.IPv4, 8472); err != nil || s.Present || len(s.Admitted) != 0 {
		t.Errorf("h3 runs with --vxlan-guard=false, and its guard is still there: %+v (%v)", s, err)
	}

	// Keep probing across a few of the hosts' kernel resyncs (1 s), at
	// which the guards read their sets back.
	seenAt := streams[0].Stats().Sent
	labtest.Eventually(t, 50*streamInterval+settle, "2.5 s more of traffic", func() error {
		if sent := streams[0].Stats().Sent; sent < seenAt+50 {
			return fmt.Errorf("%d probes since h4 left", sent-seenAt)
		}
		return nil
	})
	for i, s := range streams {
		checkStream(t, fmt.Sprintf("%s -> %s through the injection and h4 joining and leaving", []*lab.Pod{p3, flPod}[i], p1), s.Stop())
	}
}

// injectVXLAN sends frame n times as the payload of UDP datagrams from
// src (an address of host h) to dst's VXLAN port, from an ordinary UDP
// socket in h's namespace.
func injectVXLAN(t *testing.T, h *lab.Host, src, dst netip.Addr, frame []byte, n int) {
	t.Helper()
	err := lab.Do(h.NS, func() error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 8472)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.Write(frame); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send VXLAN from %s to %s: %v", src, dst, err)
	}
}

// vxlanFrame is a VXLAN payload (RFC 7348): the VXLAN header with vni,
// an Ethernet frame to dstMAC (the target's VTEP) carrying an IPv4 UDP
// packet from src to dst:port.
func vxlanFrame(vni uint32, dstMAC net.HardwareAddr, src, dst netip.Addr, port uint16) []byte {
	payload := []byte("injected")
	b := []byte{0x08, 0, 0, 0} // flags: a valid VNI
	b = binary.BigEndian.AppendUint32(b, vni<<8)
	b = append(b, dstMAC...)
	b = append(b, 0x02, 0xde, 0xad, 0xbe, 0xef, 0x01) // a made-up source MAC
	b = append(b, 0x08, 0x00)                         // IPv4
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, syscall.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	b = append(b, ip...)
	b = binary.BigEndian.AppendUint16(b, 40000) // source port
	b = binary.BigEndian.AppendUint16(b, port)
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(payload)))
	b = append(b, 0, 0) // no UDP checksum (allowed over IPv4)
	return append(b, payload...)
}

// guardDropped is h's overlay_vxlan_guard_dropped_packets_total for IPv4.
func guardDropped(t *testing.T, h *lab.Node) int64 {
	t.Helper()
	body, err := h.Metrics(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const series = `overlay_vxlan_guard_dropped_packets_total{family="ipv4"} `
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), strings.TrimSpace(series)+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", h.Name, line, err)
			}
			return int64(f)
		}
	}
	t.Fatalf("%s's /metrics has no %s", h.Name, series)
	return 0
}
