package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/lab"
)

// kernelWatch follows a host namespace's routes, neighbours and FDB entries
// through a netlink subscription (never by polling the kernel) and tells
// when an expected set of peers is fully present, or fully gone. It keeps
// its own picture of the namespace from the notifications, so it must be
// started before the entries it waits for are written (a fresh namespace,
// or one it has watched from the start).
//
// The parsing is done by hand and only reads the few attributes it needs:
// at 10,000 peers the daemon's writes produce 30,000 notifications in a few
// hundred milliseconds, and the observer must not steal the CPU it measures.
type kernelWatch struct {
	f *os.File

	mu      sync.Mutex
	routes  map[routeKey]struct{}     // our routes (proto 115), IPv4 and IPv6
	dsts    map[netip.Prefix]int      // how many of them go to each destination
	neighs  map[netip.Addr]vxlan.MAC  // permanent IPv4 and IPv6 neighbours by address
	fdbs    map[vxlan.MAC]netip.Addr  // bridge FDB entries by MAC: last remote (either family)
	waiters map[*expectation]struct{} // pending expectations
	err     error                     // the subscription broke (overflow): figures are void
	msgs    int                       // notifications parsed
	done    chan struct{}
}

// peerEntry is what a peer puts into the kernel: route to Subnet, neighbour
// Subnet.Addr() -> MAC, FDB MAC -> PublicIP. A dual-stack peer is two: its
// IPv4 entries on the IPv4 device, its IPv6 ones on the IPv6 device (the
// watcher tells them apart by address family and by MAC, never by device:
// the synthetic peers' IPv6 MACs differ from their IPv4 ones).
type peerEntry struct {
	Subnet   netip.Prefix
	PublicIP netip.Addr
	MAC      vxlan.MAC
}

// expectation waits for a set of peers to be fully present (or gone).
type expectation struct {
	present bool
	byHop   map[netip.Addr]*peerEntry
	bySub   map[netip.Prefix]*peerEntry
	byMAC   map[vxlan.MAC]*peerEntry
	missing int // entries (3 per peer) not yet in the wanted state
	at      chan time.Time
}

// watchKernel subscribes in ns to IPv4 and IPv6 route notifications and to
// neighbour notifications (of every family: IPv4 and IPv6 neighbours, and
// the bridge family's FDB entries).
func watchKernel(ns netns.NsHandle) (*kernelWatch, error) {
	var fd int
	err := lab.Do(ns, func() (err error) {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	// 10,000 peers are 30,000 notifications (60,000 in a dual stack) of
	// ~1 KiB of socket memory each when they all land before we read: ask
	// for room (root may exceed rmem_max with the FORCE variant).
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 128<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 128<<20)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV6_ROUTE | unix.RTMGRP_NEIGH}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	w := &kernelWatch{
		f:       os.NewFile(uintptr(fd), "netlink-watch"), // non-blocking: served by the runtime poller, Close wakes Read
		routes:  map[routeKey]struct{}{},
		dsts:    map[netip.Prefix]int{},
		neighs:  map[netip.Addr]vxlan.MAC{},
		fdbs:    map[vxlan.MAC]netip.Addr{},
		waiters: map[*expectation]struct{}{},
		done:    make(chan struct{}),
	}
	go w.loop()
	return w, nil
}

// Close ends the subscription.
func (w *kernelWatch) Close() {
	_ = w.f.Close()
	<-w.done
}

// Err reports whether notifications were lost (the figures are then void).
func (w *kernelWatch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Messages is the number of notifications seen.
func (w *kernelWatch) Messages() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs
}

func (w *kernelWatch) loop() {
	defer close(w.done)
	buf := make([]byte, 1<<20)
	for {
		n, err := w.f.Read(buf)
		now := time.Now()
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			w.mu.Lock()
			if w.err == nil {
				w.err = fmt.Errorf("netlink subscription: %w", err)
				if errors.Is(err, syscall.ENOBUFS) {
					w.err = fmt.Errorf("netlink subscription overflowed (notifications lost): %w", err)
				}
			}
			w.mu.Unlock()
			if errors.Is(err, syscall.ENOBUFS) {
				continue // keep reading; the measurement is already marked void
			}
			return
		}
		w.mu.Lock()
		w.parse(buf[:n], now)
		w.mu.Unlock()
	}
}

// parse applies one datagram of notifications. Callers hold mu.
func (w *kernelWatch) parse(b []byte, now time.Time) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return
		}
		body := b[unix.NLMSG_HDRLEN:l]
		w.msgs++
		switch typ {
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
			w.route(body, typ == unix.RTM_NEWROUTE, now)
		case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
			w.neigh(body, typ == unix.RTM_NEWNEIGH, now)
		}
		b = b[min(len(b), nlmAlign(l)):]
	}
}

type routeKey struct {
	dst    netip.Prefix
	metric uint32
}

func nlmAlign(n int) int { return (n + 3) &^ 3 }

// addrFrom is the IPv4 or IPv6 address in an attribute (zero if neither).
func addrFrom(val []byte) netip.Addr {
	switch len(val) {
	case 4:
		return netip.AddrFrom4([4]byte(val))
	case 16:
		return netip.AddrFrom16([16]byte(val))
	}
	return netip.Addr{}
}

// attrs calls fn for each rtattr in b.
func attrs(b []byte, fn func(typ uint16, val []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^unix.NLA_F_NESTED, b[4:l])
		b = b[min(len(b), nlmAlign(l)):]
	}
}

func (w *kernelWatch) route(body []byte, add bool, now time.Time) {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags(4)
	if len(body) < 12 || (body[0] != unix.AF_INET && body[0] != unix.AF_INET6) || body[5] != vxlan.RouteProtocol {
		return
	}
	var dst netip.Addr
	var metric uint32
	attrs(body[12:], func(typ uint16, val []byte) {
		switch {
		case typ == unix.RTA_DST:
			dst = addrFrom(val)
		case typ == unix.RTA_PRIORITY && len(val) == 4:
			metric = binary.NativeEndian.Uint32(val)
		}
	})
	if !dst.IsValid() {
		return
	}
	p := netip.PrefixFrom(dst, int(body[1]))
	k := routeKey{p, metric}
	before := w.dsts[p] > 0
	_, had := w.routes[k]
	switch {
	case add && !had: // a replace of a route we know is no change
		w.routes[k] = struct{}{}
		w.dsts[p]++
	case !add && had:
		delete(w.routes, k)
		if w.dsts[p]--; w.dsts[p] == 0 {
			delete(w.dsts, p)
		}
	}
	if after := w.dsts[p] > 0; after != before {
		for e := range w.waiters {
			if pe := e.bySub[p]; pe != nil {
				e.flip(after == e.present, now, w)
			}
		}
	}
}

func (w *kernelWatch) neigh(body []byte, add bool, now time.Time) {
	// struct ndmsg: family, pad(3), ifindex(4), state(2), flags, type
	if len(body) < 12 {
		return
	}
	family := body[0]
	state := binary.NativeEndian.Uint16(body[8:10])
	var dst netip.Addr
	var mac vxlan.MAC
	var hasMAC bool
	attrs(body[12:], func(typ uint16, val []byte) {
		switch typ {
		case unix.NDA_DST:
			dst = addrFrom(val)
		case unix.NDA_LLADDR:
			if len(val) == 6 {
				mac, hasMAC = vxlan.MAC(val), true
			}
		}
	})
	switch family {
	case unix.AF_INET, unix.AF_INET6:
		if !dst.IsValid() {
			return
		}
		old, had := w.neighs[dst]
		if add && state&vxlan.NUDPermanent != 0 && hasMAC {
			w.neighs[dst] = mac
		} else {
			delete(w.neighs, dst)
		}
		cur, has := w.neighs[dst]
		for e := range w.waiters {
			if pe := e.byHop[dst]; pe != nil {
				was := had && old == pe.MAC
				is := has && cur == pe.MAC
				if was != is {
					e.flip(is == e.present, now, w)
				}
			}
		}
	case unix.AF_BRIDGE:
		if !hasMAC {
			return
		}
		old, had := w.fdbs[mac]
		if add && dst.IsValid() {
			w.fdbs[mac] = dst
		} else {
			delete(w.fdbs, mac)
		}
		cur, has := w.fdbs[mac]
		for e := range w.waiters {
			if pe := e.byMAC[mac]; pe != nil {
				was := had && old == pe.PublicIP
				is := has && cur == pe.PublicIP
				if was != is {
					e.flip(is == e.present, now, w)
				}
			}
		}
	}
}

// flip records that one entry of e reached (good) or left its wanted state.
// Callers hold mu.
func (e *expectation) flip(good bool, now time.Time, w *kernelWatch) {
	if good {
		e.missing--
	} else {
		e.missing++
	}
	if e.missing == 0 {
		delete(w.waiters, e)
		e.at <- now
	}
}

// expect registers an expectation for peers: all their entries present
// (present=true) or all gone. The returned channel receives the time of the
// notification that completed it (at once if already so).
func (w *kernelWatch) expect(peers []peerEntry, present bool) <-chan time.Time {
	e := &expectation{present: present, at: make(chan time.Time, 1),
		byHop: make(map[netip.Addr]*peerEntry, len(peers)), bySub: make(map[netip.Prefix]*peerEntry, len(peers)),
		byMAC: make(map[vxlan.MAC]*peerEntry, len(peers))}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range peers {
		p := &peers[i]
		e.bySub[p.Subnet], e.byHop[p.Subnet.Addr()], e.byMAC[p.MAC] = p, p, p
		has := [3]bool{w.dsts[p.Subnet] > 0, false, false}
		if m, ok := w.neighs[p.Subnet.Addr()]; ok && m == p.MAC {
			has[1] = true
		}
		if d, ok := w.fdbs[p.MAC]; ok && d == p.PublicIP {
			has[2] = true
		}
		for _, h := range has {
			if h != present {
				e.missing++
			}
		}
	}
	if e.missing == 0 {
		e.at <- time.Now()
	} else {
		w.waiters[e] = struct{}{}
	}
	return e.at
}

// cancel drops a pending expectation (after a timeout).
func (w *kernelWatch) cancel(ch <-chan time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for e := range w.waiters {
		if (<-chan time.Time)(e.at) == ch {
			delete(w.waiters, e)
		}
	}
}

// missing counts the entries an unmet expectation still waits for, for a
// timeout message.
func (w *kernelWatch) missing(ch <-chan time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for e := range w.waiters {
		if (<-chan time.Time)(e.at) == ch {
			return e.missing
		}
	}
	return 0
}

// wait waits for an expectation until timeout.
func (w *kernelWatch) wait(ch <-chan time.Time, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case at := <-ch:
		return at, w.Err()
	case <-t.C:
		n := w.missing(ch)
		w.cancel(ch)
		if err := w.Err(); err != nil {
			return time.Time{}, err
		}
		return time.Time{}, fmt.Errorf("kernel entries not in the expected state after %s (%d of them still missing or present)", timeout, n)
	}
}
