package peerhealth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// Pinger is one address family's ICMP echo socket, bound to this host's
// VTEP address on the overlay device (icmp.go opens the real one).
type Pinger interface {
	// Send sends an echo request numbered seq to dst; it does not block
	// on the network.
	Send(dst netip.Addr, seq uint16) error
	// Receive blocks until an echo reply to one of this pinger's requests
	// arrives, and returns its source and number; net.ErrClosed once
	// closed, any other error for a failed read (the next may succeed).
	Receive() (from netip.Addr, seq uint16, err error)
	// Close ends Receive and releases the socket; safe twice.
	Close() error
}

// Config is a prober's: how hard it probes, and its seams.
type Config struct {
	Settings
	// Families are the address families the network carries; Open opens
	// the pinger of each (the real one: Open in icmp.go).
	Families []backend.Family
	Open     func(backend.Family) (Pinger, error)
	// Hold, if set, holds every probe while it returns true: the daemon
	// holds them until each data plane's first pass is over, so a cold
	// start's burst of kernel writes has the machine to itself and no
	// peer is probed before its route exists.
	Hold func() bool
	// OnResult, if set, is told each probe's outcome (metrics): answered
	// after rtt, or lost.
	OnResult func(fam backend.Family, answered bool, rtt time.Duration)
	Logger   *slog.Logger
	// Rand seeds the jitter (tests); nil: random.
	Rand *rand.Rand
}

// Prober probes every peer it is given. SetPeers, Peers and Summary may
// be called from any goroutine at any time; Run does the probing.
type Prober struct {
	cfg  Config
	log  *slog.Logger
	kick chan struct{}

	mu sync.Mutex
	s  *schedule
	// pending is the latest peer set of each family (famIndex), as
	// SetPeers was given it, until Run takes it into the schedule (once
	// per wake; at a cold start after the first pass) and lets it go:
	// the schedule holds all it needs. Not a copy: at a cold start a copy
	// of thousands of peers (64 bytes each) would live through the first
	// pass, when the daemon's heap is at its peak.
	pending [2][]backend.Peer
	fresh   bool // pending is newer than what s has
	// problem is why a family is not probed (its socket could not be
	// opened), by famIndex; "" while it is.
	problem [2]string
	started bool // Run has opened its sockets
}

// New returns a prober; nothing is sent before Run.
func New(cfg Config) *Prober {
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := newSchedule(cfg.Settings, rnd)
	cfg.Settings = s.set
	return &Prober{cfg: cfg, log: log, kick: make(chan struct{}, 1), s: s}
}

// Settings are the prober's, with the defaults filled in.
func (p *Prober) Settings() Settings { return p.cfg.Settings }

// SetPeers replaces the peers of fam probed, as a data plane's SetPeers
// does; it never blocks. Unlike a data plane, the prober keeps the slice
// until Run has read it: the caller must not change it afterwards (the
// daemon makes a new one for each call).
func (p *Prober) SetPeers(fam backend.Family, peers []backend.Peer) {
	p.mu.Lock()
	i := famIndex(fam)
	p.pending[i] = peers
	p.fresh = true
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// flight is a probe in flight.
type flight struct {
	key      Key
	deadline time.Time
}

// seqKey names a probe by family and number.
type seqKey struct {
	fam backend.Family
	seq uint16
}

type reply struct {
	fam  backend.Family
	from netip.Addr
	seq  uint16
	at   time.Time
}

// Run probes until ctx ends, then closes its sockets and returns nil. A
// family whose socket cannot be opened is not probed: its peers stay
// unknown, Problem says why, and the rest of the daemon runs on.
func (p *Prober) Run(ctx context.Context) error {
	replies := make(chan reply, 256)
	pingers := map[backend.Family]Pinger{}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, fam := range p.cfg.Families {
		pg, err := p.cfg.Open(fam)
		if err != nil {
			p.setProblem(fam, err.Error())
			p.log.Error("cannot probe peers: their health is not reported", "family", fam.String(), "err", err)
			continue
		}
		pingers[fam] = pg
		wg.Go(func() { receive(ctx, fam, pg, replies, p.log) })
	}
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	defer func() {
		for _, pg := range pingers {
			_ = pg.Close() // ends receive before wg.Wait
		}
	}()
	if len(pingers) == 0 {
		<-ctx.Done()
		return nil
	}

	// A send that fails because the socket itself is broken (brokenSocket:
	// the VTEP address gone with its device while the reconciler
	// recreates it) reopens the family's socket, at most once a second.
	// Any other failure (no route to that peer, a firewall's EPERM) is
	// that peer's loss alone: reopening would drop every other peer's
	// probe in flight.
	var reopened [2]time.Time
	reopen := func(fam backend.Family, now time.Time) {
		i := famIndex(fam)
		if now.Sub(reopened[i]) < time.Second {
			return
		}
		reopened[i] = now
		pg, err := p.cfg.Open(fam)
		if err != nil {
			p.log.Warn("cannot reopen the probe socket; retrying", "family", fam.String(), "err", err)
			return
		}
		_ = pingers[fam].Close()
		pingers[fam] = pg
		wg.Go(func() { receive(ctx, fam, pg, replies, p.log) })
	}

	var seq [2]uint16
	inflight := map[seqKey]flight{}
	var queue []seqKey // in send order, so in deadline order
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		// Asked before the lock: Hold reads the planes' status.
		held := p.cfg.Hold != nil && p.cfg.Hold()
		p.mu.Lock()
		// While held (a cold start's kernel writes), the peers wait in
		// pending: the schedule of thousands is built after the burst.
		if p.fresh && !held {
			p.takePending(now, [2]bool{pingers[backend.IPv4] != nil, pingers[backend.IPv6] != nil})
		}
		for len(queue) > 0 {
			f, ok := inflight[queue[0]]
			if ok && f.deadline.After(now) {
				break
			}
			delete(inflight, queue[0])
			queue = queue[1:]
			if ok {
				p.lost(f.key, now)
			}
		}
		var wake time.Time
		sentOne := false
		var failed backend.Family // a family whose send failed, 0 if none
		if !held {
			if e, at := p.s.next(); e != nil {
				if !at.After(now) {
					k := e.key.Key()
					fam := k.Family
					i := famIndex(fam)
					seq[i]++
					sk := seqKey{fam, seq[i]}
					p.s.sent(e, now)
					if err := pingers[fam].Send(k.Target(), seq[i]); err != nil {
						p.log.Debug("probe not sent", "peer", k.Subnet.String(), "err", err)
						p.lost(k, now)
						if brokenSocket(err) {
							failed = fam
						}
					} else {
						inflight[sk] = flight{key: k, deadline: now.Add(p.cfg.Timeout)}
						queue = append(queue, sk)
					}
					sentOne = true
				} else {
					wake = at
				}
			}
		}
		p.mu.Unlock()
		if failed != 0 {
			reopen(failed, now)
		}
		if sentOne {
			continue // the next may be due at once (the rate permitting)
		}
		// The first probe still in flight ends the wait (answered ones
		// ahead of it in the queue are dropped at the top of the loop).
		for _, sk := range queue {
			if f, ok := inflight[sk]; ok {
				if wake.IsZero() || f.deadline.Before(wake) {
					wake = f.deadline
				}
				break
			}
		}
		wait := time.Hour
		switch {
		case held:
			wait = holdPoll
		case !wake.IsZero():
			wait = max(0, wake.Sub(now))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-p.kick:
		case r := <-replies:
			f, ok := inflight[seqKey{r.fam, r.seq}]
			if ok && f.key.Target() == r.from {
				delete(inflight, seqKey{r.fam, r.seq}) // its queue slot is skipped when reached
				p.answered(f.key, r.at)
			}
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// takePending makes the pending peer sets the schedule's, at now, and
// releases them; p.mu is held. A family without a socket (not open) is
// not probed: its peers stay out of the schedule.
func (p *Prober) takePending(now time.Time, open [2]bool) {
	var sets [2][]backend.Peer
	for i := range sets {
		if open[i] {
			sets[i] = p.pending[i]
		}
	}
	p.s.setPeers(now, sets[0], sets[1])
	p.pending = [2][]backend.Peer{}
	p.fresh = false
}

// holdPoll is how often a held prober looks whether it may start.
const holdPoll = 100 * time.Millisecond

// brokenSocket tells whether a send's err means the socket itself is
// broken (closed, or its bound address or device gone), so that only a
// fresh socket can send again; any other error concerns that one probe.
func brokenSocket(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EADDRNOTAVAIL)
}

// receive hands pg's replies to out until pg is closed or ctx ends. A
// failed read (not a closed socket) is logged once and read past: the
// family must not go dark for good on one bad read.
func receive(ctx context.Context, fam backend.Family, pg Pinger, out chan<- reply, log *slog.Logger) {
	warned := false
	for {
		from, seq, err := pg.Receive()
		if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
			return
		}
		if err != nil {
			if !warned {
				warned = true
				log.Warn("cannot read a probe reply; reading on", "family", fam.String(), "err", err)
			}
			// Not a busy loop if the error repeats.
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			continue
		}
		select {
		case out <- reply{fam: fam, from: from, seq: seq, at: time.Now()}:
		case <-ctx.Done():
			return
		}
	}
}

// answered applies an answer to k's probe in flight (it takes p.mu).
func (p *Prober) answered(k Key, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.s.lookup(k)
	if e == nil || e.index >= 0 {
		return
	}
	rtt := time.Duration(p.s.at(now) - e.last)
	downSince := e.since
	if _, back := p.s.answered(k, rtt, now); back {
		p.log.Info("peer reachable again", "peer", k.Subnet.String(), "family", k.Family.String(), "vtep", k.Target().String(), "public_ip", e.public.Addr().String(), "rtt", rtt.Round(time.Microsecond).String(), "down_for", time.Duration(p.s.at(now)-downSince).Round(time.Second).String())
	}
	if p.cfg.OnResult != nil {
		p.cfg.OnResult(k.Family, true, rtt)
	}
}

// lost applies the loss of k's probe in flight; p.mu is held.
func (p *Prober) lost(k Key, now time.Time) {
	e, down := p.s.lost(k, now)
	if e == nil {
		return
	}
	if down {
		p.log.Warn("peer unreachable", "peer", k.Subnet.String(), "family", k.Family.String(), "vtep", k.Target().String(), "public_ip", e.public.Addr().String(), "lost_in_a_row", e.losses,
			"hint", "see Documentation/troubleshooting.md, \"A peer is unreachable\"")
	}
	if p.cfg.OnResult != nil {
		p.cfg.OnResult(k.Family, false, 0)
	}
}

func (p *Prober) setProblem(fam backend.Family, why string) {
	p.mu.Lock()
	p.problem[famIndex(fam)] = why
	p.mu.Unlock()
}

func famIndex(fam backend.Family) int {
	if fam == backend.IPv6 {
		return 1
	}
	return 0
}

// PeerHealth is one peer's health in one family, as /status and
// `overlayd status --peers` show it.
type PeerHealth struct {
	Peer     string `json:"peer"`   // its subnet, e.g. 10.244.7.0/24
	Family   string `json:"family"` // IPv4 or IPv6
	VTEP     string `json:"vtep"`   // the address probed, e.g. 10.244.7.0
	PublicIP string `json:"publicIP"`
	State    State  `json:"state"` // reachable, unreachable or unknown
	// Since is when State was entered (for unknown: when the peer was
	// first seen).
	Since             time.Time `json:"since"`
	LastRTTMicros     int64     `json:"lastRTTMicros"`     // 0 before the first answer
	SmoothedRTTMicros int64     `json:"smoothedRTTMicros"` // 1/8 gain, as TCP's SRTT
	ConsecutiveLosses int       `json:"consecutiveLosses"`
	Sent              uint64    `json:"sent"`
	Received          uint64    `json:"received"`
	Lost              uint64    `json:"lost"`
	LastProbe         time.Time `json:"lastProbe,omitzero"`
}

// report is e's health, its times on the wall clock.
func (s *schedule) report(e *entry) PeerHealth {
	k := e.key.Key()
	return PeerHealth{Peer: k.Subnet.String(), Family: k.Family.String(), VTEP: k.Target().String(), PublicIP: e.public.Addr().String(),
		State: e.state, Since: s.wall(e.since), LastRTTMicros: e.lastRTT.Microseconds(), SmoothedRTTMicros: e.srtt.Microseconds(),
		ConsecutiveLosses: int(e.losses), Sent: uint64(e.sent), Received: uint64(e.received), Lost: uint64(e.lost), LastProbe: s.wall(e.last)}
}

// Peers returns every peer's health, by family then subnet.
func (p *Prober) Peers() []PeerHealth {
	p.mu.Lock()
	es := make([]*entry, len(p.s.peers))
	for i := range p.s.peers {
		es[i] = &p.s.peers[i]
	}
	slices.SortFunc(es, func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.key.fam, b.key.fam), a.key.subnet.compare(b.key.subnet))
	})
	out := make([]PeerHealth, len(es))
	for i, e := range es {
		out[i] = p.s.report(e)
	}
	p.mu.Unlock()
	return out
}

// FamilyCounts are the peers of one family in each state, and the probes'
// totals.
type FamilyCounts struct {
	Reachable   int    `json:"reachable"`
	Unreachable int    `json:"unreachable"`
	Unknown     int    `json:"unknown"`
	Sent        uint64 `json:"sent"`
	Received    uint64 `json:"received"`
	Lost        uint64 `json:"lost"`
}

// Summary is the prober's state at a glance: what /status shows of it
// beside (or instead of) every peer.
type Summary struct {
	// Probing is false when no family could be probed (see Problems) or
	// before the prober started.
	Probing bool `json:"probing"`
	// Problems say why a family is not probed (its socket could not be
	// opened) and what to do.
	Problems      []string     `json:"problems,omitempty"`
	SweepSeconds  float64      `json:"sweepSeconds"` // the sweep the rate allows with the current peers
	RatePerSecond float64      `json:"ratePerSecond"`
	IPv4          FamilyCounts `json:"ipv4"`
	IPv6          FamilyCounts `json:"ipv6"`
	// Worst are the few peers in the worst state: unreachable longest
	// first, then most losses in a row, then slowest.
	Worst []PeerHealth `json:"worst"`
}

// WorstPeers is how many peers Summary.Worst names at most.
const WorstPeers = 5

// Summary counts the peers and names the worst few.
func (p *Prober) Summary() Summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	sum := Summary{SweepSeconds: p.s.period().Seconds(), RatePerSecond: p.cfg.Rate, Worst: []PeerHealth{}}
	for i, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		if p.problem[i] != "" {
			sum.Problems = append(sum.Problems, fam.String()+": "+p.problem[i])
		}
	}
	sum.Probing = p.started && len(sum.Problems) < len(p.cfg.Families)
	sum.IPv4, sum.IPv6 = p.counts()
	// The few worst, kept sorted as the peers go by: no sort of
	// thousands at every look.
	worst := make([]*entry, 0, WorstPeers+1)
	for i := range p.s.peers {
		e := &p.s.peers[i]
		if e.state != Unreachable && e.losses == 0 && e.srtt == 0 {
			continue // nothing known against it
		}
		if len(worst) == WorstPeers && worse(e, worst[len(worst)-1]) >= 0 {
			continue
		}
		i, _ := slices.BinarySearchFunc(worst, e, worse)
		worst = slices.Insert(worst, i, e)
		if len(worst) > WorstPeers {
			worst = worst[:WorstPeers]
		}
	}
	for _, e := range worst {
		sum.Worst = append(sum.Worst, p.s.report(e))
	}
	return sum
}

// Counts are the peers of each family in each state, and the probes'
// totals (what the metrics show).
func (p *Prober) Counts() (v4, v6 FamilyCounts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts()
}

// counts is Counts with p.mu held.
func (p *Prober) counts() (v4, v6 FamilyCounts) {
	for i := range p.s.peers {
		e := &p.s.peers[i]
		c := &v4
		if e.key.fam == backend.IPv6 {
			c = &v6
		}
		switch e.state {
		case Reachable:
			c.Reachable++
		case Unreachable:
			c.Unreachable++
		default:
			c.Unknown++
		}
		c.Sent += uint64(e.sent)
		c.Received += uint64(e.received)
		c.Lost += uint64(e.lost)
	}
	return v4, v6
}

// worse orders a before b if a is in the worse state.
func worse(a, b *entry) int {
	au, bu := a.state == Unreachable, b.state == Unreachable
	switch {
	case au && !bu:
		return -1
	case bu && !au:
		return 1
	case au && bu:
		return cmp.Or(cmp.Compare(a.since, b.since), a.key.subnet.compare(b.key.subnet))
	}
	return cmp.Or(cmp.Compare(b.losses, a.losses), cmp.Compare(b.srtt, a.srtt), a.key.subnet.compare(b.key.subnet))
}

// ErrNoSocket says that neither kind of ICMP socket may be opened here.
var ErrNoSocket = errors.New("no ICMP socket allowed")

// noSocketError is the error Open returns when neither socket is allowed.
func noSocketError(fam backend.Family, dgram, raw error) error {
	sysctl := "net.ipv4.ping_group_range"
	return fmt.Errorf("%w for %s probes: an unprivileged ICMP socket failed (%v; allow overlayd's group in %s) and a raw one failed (%v; give overlayd CAP_NET_RAW)",
		ErrNoSocket, fam, dgram, sysctl, raw)
}
