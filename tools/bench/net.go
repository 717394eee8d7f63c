package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/lab"
)

// streamPort is where the stream receiver listens (any free port of the
// destination namespace; the pods' responders use lab.ProbePort).
const streamPort = 5201

// twoHosts is a lab of two hosts running overlayd with a pod each.
type twoHosts struct {
	l      *lab.Lab
	h1, h2 *lab.Node
	p1, p2 *lab.Pod
}

func (b *bench) newTwoHosts(ctx context.Context, tag, network string, seed int) (_ *twoHosts, err error) {
	t := &twoHosts{}
	if t.l, err = b.newLab(ctx, tag, network); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.l.Close()
		}
	}()
	if seed > 0 {
		cli, err := t.l.Etcd.Client()
		if err != nil {
			return nil, err
		}
		_, err = putLeases(ctx, cli, synthPeers(1, seed+1))
		cli.Close()
		if err != nil {
			return nil, err
		}
	}
	for i, h := range []**lab.Node{&t.h1, &t.h2} {
		if *h, err = t.l.AddNode(fmt.Sprintf("h%d", i+1), i+1); err != nil {
			return nil, err
		}
		if err := (*h).Start(); err != nil {
			return nil, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, h := range []*lab.Node{t.h1, t.h2} {
		if err := h.WaitReady(rctx); err != nil {
			return nil, err
		}
	}
	if t.p1, err = t.h1.AddPod(ctx, "p1"); err != nil {
		return nil, err
	}
	if t.p2, err = t.h2.AddPod(ctx, "p2"); err != nil {
		return nil, err
	}
	// Both hosts learn the other's lease through the watch: wait until the
	// pods reach each other (bounded).
	var last error
	for range 100 {
		if _, last = lab.WhoAmI(t.p1.NS, netip.AddrPortFrom(t.p2.IP, lab.ProbePort), time.Second); last == nil {
			if _, last = lab.WhoAmI(t.p2.NS, netip.AddrPortFrom(t.p1.IP, lab.ProbePort), time.Second); last == nil {
				return t, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("pods never reached each other: %w", last)
}

// benchNet measures single-stream TCP throughput and RTT pod to pod across
// hosts (through both hosts' bridges and VXLAN devices) and host to host on
// the underlay, interleaved run by run.
func (b *bench) benchNet(ctx context.Context) error {
	t, err := b.newTwoHosts(ctx, "net", lab.DefaultNetworkConfig, 0)
	if err != nil {
		return err
	}
	defer t.l.Close()
	var pod, host, ratio, podCPU, hostCPU, cpuRatio []float64
	for run := range b.cfg.Runs {
		h, err := tcpStream(t.h1.NS, t.h2.NS, t.h2.IP, b.cfg.Stream)
		if err != nil {
			return fmt.Errorf("host stream: %w", err)
		}
		p, err := tcpStream(t.p1.NS, t.p2.NS, t.p2.IP, b.cfg.Stream)
		if err != nil {
			return fmt.Errorf("pod stream: %w", err)
		}
		b.logf("TCP stream run %d: host→host %.2f Gbit/s (%.0f ms CPU/GB), pod→pod %.2f Gbit/s (%.0f ms CPU/GB), ratio %.3f",
			run+1, h.bps/1e9, h.cpuPerGB, p.bps/1e9, p.cpuPerGB, p.bps/h.bps)
		host, pod, ratio = append(host, h.bps/1e9), append(pod, p.bps/1e9), append(ratio, p.bps/h.bps)
		hostCPU, podCPU = append(hostCPU, h.cpuPerGB), append(podCPU, p.cpuPerGB)
		cpuRatio = append(cpuRatio, h.cpuPerGB/p.cpuPerGB)
	}
	b.add(result{Measure: "tcp_stream", Metric: "host_to_host", Unit: "Gbit/s"}, host)
	b.add(result{Measure: "tcp_stream", Metric: "pod_to_pod", Unit: "Gbit/s"}, pod)
	b.add(result{Measure: "tcp_stream", Metric: "pod_over_host", Unit: "ratio"}, ratio)
	b.add(result{Measure: "tcp_stream", Metric: "host_to_host_cpu_per_gb", Unit: "ms"}, hostCPU)
	b.add(result{Measure: "tcp_stream", Metric: "pod_to_pod_cpu_per_gb", Unit: "ms"}, podCPU)
	b.add(result{Measure: "tcp_stream", Metric: "cpu_per_gb_host_over_pod", Unit: "ratio"}, cpuRatio)

	var podRTT, hostRTT []float64
	for range b.cfg.Pings {
		d, err := lab.Ping(t.h1.NS, t.h2.IP, time.Second)
		if err != nil {
			return fmt.Errorf("host ping: %w", err)
		}
		hostRTT = append(hostRTT, ms(d))
		if d, err = lab.Ping(t.p1.NS, t.p2.IP, time.Second); err != nil {
			return fmt.Errorf("pod ping: %w", err)
		}
		podRTT = append(podRTT, ms(d))
		time.Sleep(5 * time.Millisecond)
	}
	b.add(result{Measure: "rtt_icmp", Metric: "host_to_host", Unit: "ms"}, hostRTT)
	b.add(result{Measure: "rtt_icmp", Metric: "pod_to_pod", Unit: "ms"}, podRTT)
	return nil
}

// stream is what one TCP stream measured.
type stream struct {
	bps      float64 // goodput at the receiver, bit/s
	cpuPerGB float64 // CPU time of the whole machine per GB received, ms
}

// tcpStream sends one TCP stream from namespace src to dst (in namespace
// dstNS) for d and returns the goodput seen by the receiver, in bit/s: the
// bytes received over the time from the first to the last byte. Sender and
// receiver are goroutines of this process, so both paths measured pay the
// same user-space copies. It also returns the CPU time all CPUs spent
// meanwhile (user, system and softirq, from /proc/stat) per GB received:
// both simulated hosts share this machine's CPUs, so that is the whole
// cost of moving the bytes, sender, receiver and every hop between.
func tcpStream(src, dstNS netns.NsHandle, dst netip.Addr, d time.Duration) (stream, error) {
	ln, err := lab.ListenTCP(dstNS, netip.AddrPortFrom(dst, streamPort))
	if err != nil {
		return stream{}, err
	}
	defer ln.Close()
	type got struct {
		n           int64
		first, last time.Time
		err         error
	}
	res := make(chan got, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- got{err: err}
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(d + 10*time.Second))
		var g got
		buf := make([]byte, 256<<10)
		for {
			k, err := c.Read(buf)
			if k > 0 {
				now := time.Now()
				if g.first.IsZero() {
					g.first = now
				}
				g.n += int64(k)
				g.last = now
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					g.err = err
				}
				break
			}
		}
		res <- g
	}()
	conn, err := lab.DialTCP(src, netip.AddrPortFrom(dst, streamPort), 2*time.Second)
	if err != nil {
		return stream{}, err
	}
	cpu0, err := busyCPU()
	if err != nil {
		conn.Close()
		return stream{}, err
	}
	buf := make([]byte, 128<<10)
	_ = conn.SetWriteDeadline(time.Now().Add(d))
	for {
		if _, err := conn.Write(buf); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				conn.Close()
				return stream{}, err
			}
			break
		}
	}
	conn.Close()
	g := <-res
	if g.err != nil {
		return stream{}, g.err
	}
	cpu1, err := busyCPU()
	if err != nil {
		return stream{}, err
	}
	span := g.last.Sub(g.first)
	if span <= 0 || g.n == 0 {
		return stream{}, errors.New("nothing received")
	}
	return stream{
		bps:      float64(g.n) * 8 / span.Seconds(),
		cpuPerGB: ms(cpu1-cpu0) / (float64(g.n) / 1e9),
	}, nil
}
