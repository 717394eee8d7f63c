// Package daemon wires the pieces of `overlayd run` together:
//
//	etcd ──Manager──▶ this host's lease ──▶ subnet.env (for overlay-cni)
//	etcd ──Watch────▶ peerSet (validate) ──SetPeers──▶ vxlan backend ──▶ kernel
//
// The lease manager keeps our subnet, the watcher follows every other
// host's, the peer set turns leases into validated peers, and the backend
// converges the kernel to them. Shutdown leaves the data path in place so a
// restart drops no packets; Teardown removes it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Config is everything `overlayd run` is told.
type Config struct {
	Etcd   etcdclient.Config
	Prefix string

	NodeName      string // --node-name; empty: machine ID, then hostname
	MachineIDFile string // default /etc/machine-id
	Iface         string
	PublicIP      netip.Addr
	SubnetFile    string
	LeaseTTL      time.Duration
	// LivenessTTL is the TTL of the liveness key (default 15 s); it bounds
	// how long an etcd outage goes unnoticed by readiness.
	LivenessTTL time.Duration
	// IPMasq: overlayd masquerades pod traffic leaving the cluster network
	// (so subnet.env tells the bridge plugin not to).
	IPMasq bool

	// HealthAddr is where /healthz, /readyz, /metrics and /status are
	// served ("" disables); HealthListener, if set, is used instead (tests
	// open it inside the host's namespace).
	HealthAddr     string
	HealthListener net.Listener

	// KernelResync is how often the kernel is re-listed to repair drift
	// (default 30 s); LeaseResync how often etcd is (default 5 min).
	KernelResync time.Duration
	LeaseResync  time.Duration

	// NetNS is the network namespace to program; a closed handle (the
	// default) means the process's own. Tests run several daemons in one
	// process, each in its own namespace.
	NetNS netns.NsHandle

	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = etcdv3.DefaultPrefix
	}
	if c.MachineIDFile == "" {
		c.MachineIDFile = "/etc/machine-id"
	}
	if c.SubnetFile == "" {
		c.SubnetFile = subnet.DefaultEnvFile
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.NetNS == 0 {
		c.NetNS = netns.None()
	}
}

// retryInterval bounds the pause between attempts to reach etcd at startup.
const retryInterval = 2 * time.Second

// Run runs the daemon until ctx ends (returning nil, data path left in
// place) or the lease is lost or cannot be had (returning the error). Every
// wait of start-up ends: in success, in a fatal error, or — when ctx ends,
// at any phase — in a clean return of nil.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	err := run(ctx, cfg)
	if ctx.Err() != nil {
		// Whatever was in progress ended because we were told to stop.
		return nil
	}
	return err
}

func run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	nodeID, err := NodeID(cfg.NodeName, cfg.MachineIDFile)
	if err != nil {
		return err
	}
	h, err := netlinkHandle(cfg.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	ul, err := DetectUnderlay(h, cfg.Iface, cfg.PublicIP)
	if err != nil {
		return err
	}
	lock, err := lockHost(cfg.SubnetFile)
	if err != nil {
		return fmt.Errorf("%w: stop it first, or give this one its own --subnet-file and --health-addr", err)
	}
	defer lock.release()
	log = log.With("node", nodeID)
	log.Info("starting", "iface", ul.Iface, "public_ip", ul.PublicIP, "etcd", cfg.Etcd.Endpoints, "prefix", cfg.Prefix)

	// Shutdown order matters: stop every goroutine first, then close what
	// they use (etcd client, netlink sockets, nftables), newest first.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var closers []func()
	defer func() {
		cancel()
		wg.Wait()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	st := &probe{node: nodeID, iface: ul.Iface, publicIP: ul.PublicIP}
	m := newMetrics(st)
	if ln, err := healthListener(cfg); err != nil {
		return err
	} else if ln != nil {
		hlog := log // run re-binds log below; the goroutine keeps its own
		wg.Go(func() { serveHTTP(ctx, ln, st, m, hlog) })
		log.Info("serving health and metrics", "addr", ln.Addr())
	}
	steps := stepper{log: log, st: st}

	var cli *clientv3.Client
	if err := steps.retry(ctx, "reach etcd at "+strings.Join(cfg.Etcd.Endpoints, ","), func(ctx context.Context) (err error) {
		cli, err = etcdclient.Connect(ctx, cfg.Etcd)
		return err
	}); err != nil {
		return err
	}
	closers = append(closers, func() { _ = cli.Close() })
	reg := etcdv3.NewRegistry(cli, cfg.Prefix)

	var netCfg *subnet.Config
	if err := steps.retry(ctx, "read the network config", func(ctx context.Context) (err error) {
		netCfg, _, err = reg.GetConfig(ctx)
		return err
	}); err != nil {
		return err
	}

	host := etcdv3.Host{NodeID: nodeID, PublicIP: ul.PublicIP, VtepMAC: vxlan.VtepMAC(nodeID, netCfg.Backend.VNI), Previous: previousLease(cfg.SubnetFile, netCfg, log)}
	host.Hostname, _ = os.Hostname()
	mgr := etcdv3.NewManager(reg, netCfg, host, etcdv3.ManagerOptions{LeaseTTL: cfg.LeaseTTL, LivenessTTL: cfg.LivenessTTL, Logger: log, OnWait: st.setPhase})
	// The wait for another host's liveness key is bounded by that key's
	// TTL, not by a per-attempt timeout: it must be allowed to end.
	if err := steps.retryUnbounded(ctx, "check that node ID "+strconv.Quote(nodeID)+" is not in use", mgr.CheckNodeID); err != nil {
		return err
	}
	// Acquire lists every lease to pick a subnet; that listing also seeds
	// the peers and the watch below.
	var lease subnet.Lease
	var snap etcdv3.Snapshot
	if err := steps.retry(ctx, "acquire a lease", func(ctx context.Context) (err error) {
		lease, snap, err = mgr.Acquire(ctx)
		return err
	}); err != nil {
		return err
	}
	st.set(func(p *probe) { p.mgr = mgr })
	log = log.With("subnet", lease.Subnet)

	st.setPhase("setting up the VXLAN device")
	nl, err := vxlan.OpenNetlink(cfg.NetNS)
	if err != nil {
		return err
	}
	closers = append(closers, func() { _ = nl.Close() })
	be, err := vxlan.New(vxlan.Config{
		VNI: netCfg.Backend.VNI, Port: netCfg.Backend.Port, DirectRouting: netCfg.Backend.DirectRouting, MTU: netCfg.Backend.MTU,
		Underlay: ul.Iface, LocalIP: ul.PublicIP, OwnSubnet: lease.Subnet, NodeID: nodeID,
		ResyncInterval: cfg.KernelResync, Logger: log, OnPeerProgrammed: m.programmed,
	}, nl)
	if err != nil {
		return err
	}
	st.set(func(p *probe) { p.be = be })
	dev, err := be.EnsureDevice(ctx)
	if err != nil {
		return fmt.Errorf("set up the VXLAN device: %w", err)
	}

	// The peers are programmed from here on, while the masquerade table and
	// subnet.env are set up: neither depends on the other, and at a cold
	// start the first pass is most of the time to converge.
	peers := newPeerSet(netCfg, lease.Subnet, reg.SubnetsPrefix())
	now := time.Now()
	for _, l := range snap.Leases {
		m.eventArrived(l.Subnet, now)
	}
	m.rejected(peers.reset(snap), log)
	publishPeers(be, peers, st, m)
	c := peers.counts()
	log.Info("initial lease set", "peers", len(peers.valid), "invalid", c.invalid, "orphaned", c.orphaned, "reserved", c.reserved, "revision", snap.Revision)
	wg.Go(func() { _ = be.Run(ctx) })

	if cfg.IPMasq {
		mq, err := startMasq(ctx, &wg, cfg, netCfg.Network, dev.Name, log)
		if err != nil {
			return err
		}
		closers = append(closers, func() { _ = mq.Close() })
	}
	env := newEnvKeeper(cfg.SubnetFile, subnet.NewEnv(netCfg.Network, lease.Subnet, dev.MTU, cfg.IPMasq))
	if _, err := env.ensure(); err != nil {
		return err
	}
	log.Info("lease held and device ready", "device", dev.Name, "vtep_mac", dev.VtepMAC.String(), "mtu", dev.MTU, "subnet_file", cfg.SubnetFile)

	fatal := make(chan error, 1)
	wg.Go(func() {
		if err := mgr.Run(ctx); err != nil {
			fatal <- err
		}
	})
	batches := reg.Watch(ctx, snap, etcdv3.WatchOptions{ResyncInterval: cfg.LeaseResync, Logger: log,
		OnRestart: func(string) { m.watchRestarts.Inc() }})
	configs := reg.WatchConfig(ctx, retryInterval)
	// Both watches end by closing their channel once ctx is cancelled; the
	// deferred shutdown waits for that before the etcd client closes, so a
	// re-list in flight never runs on a closed client.
	wg.Go(func() { <-ctx.Done(); drain(batches); drain(configs) })
	drift := configWatch{running: netCfg, lease: lease.Subnet, key: reg.ConfigKey(), log: log}
	st.set(func(p *probe) { p.env, p.phase = env, "" })
	envCheck := time.NewTicker(envCheckInterval)
	defer envCheck.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping; the data path stays in place (overlayd teardown removes it)")
			return nil
		case err := <-fatal:
			return err
		case b, ok := <-batches:
			if !ok {
				continue // ctx is ending
			}
			logEvents(log, b, lease.Subnet)
			now := time.Now()
			for _, ev := range b.Events {
				if ev.Type == subnet.Removed {
					m.eventGone(ev.Lease.Subnet)
				} else {
					m.eventArrived(ev.Lease.Subnet, now)
				}
			}
			m.rejected(peers.apply(b), log)
			publishPeers(be, peers, st, m)
		case u, ok := <-configs:
			if ok {
				reason := drift.update(u)
				st.set(func(p *probe) { p.config = reason })
			}
		case <-envCheck.C:
			// The device MTU follows the underlay's; pods must learn it.
			if mtu := be.Status().MTU; mtu > 0 {
				env.set(func(e *subnet.Env) { e.MTU = mtu })
			}
			env.keep(log)
		}
	}
}

// drain discards what ch delivers until it is closed.
func drain[T any](ch <-chan T) {
	for range ch {
	}
}

// netlinkHandle opens a netlink handle in ns (or the current namespace).
func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return h, nil
}

// previousLease returns the subnet of an old subnet.env if it fits the
// network; the manager reuses it only if no one holds it.
func previousLease(path string, cfg *subnet.Config, log *slog.Logger) netip.Prefix {
	env, err := subnet.ReadEnv(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("ignoring the previous subnet file", "err", err)
		}
		return netip.Prefix{}
	}
	if !cfg.Contains(env.Lease()) {
		return netip.Prefix{}
	}
	return env.Lease()
}

// stepper runs the steps of start-up that wait for something, keeping
// readiness's "startup" reason true to what is being waited for.
type stepper struct {
	log *slog.Logger
	st  *probe
}

// attemptTimeout bounds each attempt of a start-up step, so an unreachable
// etcd is retried rather than waited on forever.
const attemptTimeout = 10 * time.Second

// retry runs fn until it succeeds, ctx ends, or the error is one waiting
// cannot fix (no free subnet, lease lost, duplicate node ID, stranded
// lease, bad client settings). Each attempt gets attemptTimeout.
func (s stepper) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return s.run(ctx, what, attemptTimeout, fn)
}

// retryUnbounded is retry for a step that bounds its own waits.
func (s stepper) retryUnbounded(ctx context.Context, what string, fn func(context.Context) error) error {
	return s.run(ctx, what, 0, fn)
}

func (s stepper) run(ctx context.Context, what string, timeout time.Duration, fn func(context.Context) error) error {
	var lastLog time.Time
	s.st.setPhase("trying to " + what)
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, timeout)
		}
		err := fn(actx)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				s.log.Info("succeeded after retrying", "what", what, "attempts", attempt)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case fatalAtStart(err):
			return fmt.Errorf("%s: %w", what, err)
		}
		s.st.setPhase("waiting to " + what + ": " + err.Error())
		if time.Since(lastLog) >= etcdv3.WarnEvery {
			s.log.Error("cannot "+what+", retrying", "err", err, "attempt", attempt)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryInterval):
		}
	}
}

func fatalAtStart(err error) bool {
	for _, fatal := range []error{subnet.ErrOutOfSubnets, etcdv3.ErrLeaseLost, etcdv3.ErrDuplicateNode, etcdv3.ErrStranded, etcdclient.ErrConfig} {
		if errors.Is(err, fatal) {
			return true
		}
	}
	return false
}

func logEvents(log *slog.Logger, b etcdv3.Batch, own netip.Prefix) {
	for _, ev := range b.Events {
		if ev.Lease.Subnet == own {
			continue
		}
		attrs := []any{"peer", ev.Lease.Subnet, "public_ip", ev.Lease.Attrs.PublicIP, "node_id", ev.Lease.Attrs.NodeID}
		if d, err := ev.Lease.Attrs.VXLAN(); err == nil {
			attrs = append(attrs, "vtep_mac", d.VtepMAC)
		}
		log.Info("peer "+ev.Type.String(), attrs...)
	}
}

// rejected logs and counts newly skipped leases.
func (m *metrics) rejected(rs []rejection, log *slog.Logger) {
	for _, r := range rs {
		if r.Kind == orphanedLease {
			log.Warn("skipping orphaned lease", "key", r.Key, "reason", r.Err)
		} else {
			log.Warn("skipping invalid lease", "key", r.Key, "err", r.Err)
			m.rejectionsTotal.Inc()
		}
		if p, err := subnet.ParseKey(r.Key[strings.LastIndexByte(r.Key, '/')+1:]); err == nil {
			m.eventGone(p)
		}
	}
}

// publishPeers hands the peer set to the backend and records its size.
func publishPeers(be *vxlan.Backend, peers *peerSet, st *probe, m *metrics) {
	be.SetPeers(peers.peers())
	valid, c := len(peers.valid), peers.counts()
	st.set(func(p *probe) { p.peers, p.counts = valid, c })
	m.leasesSeen.Set(float64(valid + c.invalid + c.orphaned + c.reserved + 1)) // + our own
	m.leasesRejected.Set(float64(c.invalid))
	m.leasesOrphaned.Set(float64(c.orphaned))
	m.leasesReserved.Set(float64(c.reserved))
}

// masqInterval is how often the masquerade table is checked and repaired.
const masqInterval = 30 * time.Second

// startMasq installs overlayd's nftables table and keeps it in place.
func startMasq(ctx context.Context, wg *sync.WaitGroup, cfg Config, network netip.Prefix, device string, log *slog.Logger) (*masq.Masq, error) {
	opts := []masq.Option{masq.WithOverlayDevice(device), masq.WithLogger(log)}
	if cfg.NetNS.IsOpen() {
		opts = append(opts, masq.WithNetNS(cfg.NetNS))
	}
	mq, err := masq.New(network, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := mq.Ensure(); err != nil {
		mq.Close()
		return nil, fmt.Errorf("--ip-masq: install the nftables table %q: %w (does the kernel have nf_tables with NAT? use --ip-masq=false to masquerade elsewhere)", masq.TableName, err)
	}
	if drops, err := mq.ForwardDrops(); err == nil && len(drops) > 0 {
		log.Warn("forward chains with policy drop exist; they drop pod traffic unless they accept the cluster network: add that accept there",
			"chains", drops, "network", network)
	}
	wg.Go(func() { _ = mq.Run(ctx, masqInterval, nil) })
	return mq, nil
}

// healthListener opens the health endpoint's listener, if one is wanted.
func healthListener(cfg Config) (net.Listener, error) {
	if cfg.HealthListener != nil {
		return cfg.HealthListener, nil
	}
	if cfg.HealthAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.HealthAddr)
	if errors.Is(err, syscall.EADDRINUSE) {
		// Not another overlayd with this --subnet-file: that one holds the lock.
		return nil, fmt.Errorf("--health-addr %s is in use by another program: set --health-addr to another address, or \"\" to disable", cfg.HealthAddr)
	}
	if err != nil {
		return nil, fmt.Errorf("--health-addr %s: %w", cfg.HealthAddr, err)
	}
	return ln, nil
}
