// Package daemon wires the pieces of `overlayd run` together:
//
//	subnet.Source ──Acquire, Keep──▶ this host's lease ──▶ subnet.env (for overlay-cni)
//	subnet.Source ──Watch──────────▶ peerSet (validate) ──SetPeers──▶ planes ──▶ kernel
//
// The lease source (etcd: subnet/etcdv3.Source) keeps our subnet and
// follows every other host's, the peer set turns leases into validated
// peers, and the data planes (backend.Plane, one per address family,
// built by Kernel.Plane) converge the kernel to them. The daemon knows
// the source only through subnet.Source: the node-ID claim, the lease
// journal and the catch-up of a resumed watch are the etcd source's.
// Shutdown leaves the data path in place so a
// restart drops no packets; Teardown removes it.
//
// Run's goroutine does start-up in phases (serveHealth, join,
// startDataPlane) and then the loop; every other goroutine it starts (the
// health server, the planes, the masquerade, the lease manager, the
// watches' drain) is in one WaitGroup that shutdown waits for before it
// closes the clients they use. The daemon reaches the kernel only through
// Kernel, so its wiring is tested without root (wiring_test.go).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/peerhealth"
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
	// PublicIPv6 is the IPv6 underlay address (--public-ipv6); zero: the
	// interface's first global IPv6 address. Used if the network carries
	// IPv6.
	PublicIPv6 netip.Addr
	SubnetFile string
	// SubnetFileFormat is the format SubnetFile is written in
	// (--subnet-file-format): "" or subnet.FormatOverlay, or
	// subnet.FormatFlannel (flanneld's FLANNEL_* keys, for tools written
	// for flannel).
	SubnetFileFormat subnet.EnvFormat
	LeaseTTL         time.Duration
	// LivenessTTL is the TTL of the liveness key (default 15 s); it bounds
	// how long an etcd outage goes unnoticed by readiness.
	LivenessTTL time.Duration
	// IPMasq: overlayd masquerades pod traffic leaving the cluster network
	// (so subnet.env tells the bridge plugin not to).
	IPMasq bool
	// VXLANGuard lets UDP to the VXLAN port in only from the public
	// addresses of the peers (--vxlan-guard, default on; backend/guard):
	// the planes drive it. Off, a guard table of an earlier run is
	// removed.
	VXLANGuard bool
	// AdoptFlannel takes over what flanneld left on this host, in place
	// (--adopt-flannel): its devices flannel.<VNI> and flannel-v6.<VNI>
	// with their MACs, the routes on them, and its masquerade chain once
	// ours is in place. Its lease is adopted as any lease naming this
	// host's public IP is. Without flannel's devices it does nothing.
	AdoptFlannel bool
	// FlannelSubnetFile is where flanneld wrote its subnet.env
	// (--flannel-subnet-file, default FlannelSubnetFile). With
	// AdoptFlannel, the subnet it names, like the address of flanneld's
	// device, must be this host's lease (in kube mode: its Node's
	// podCIDR), or the start fails (ErrFlannelSubnet): the pods flanneld
	// served hold addresses of that subnet. A missing file is not checked.
	FlannelSubnetFile string

	// HealthAddr is where /healthz, /readyz, /metrics and /status are
	// served ("" disables); HealthListener, if set, is used instead (tests
	// open it inside the host's namespace).
	HealthAddr     string
	HealthListener net.Listener

	// NoPeerProbe turns the probing of peers off (--peer-probe=false);
	// PeerProbe tunes it (--peer-probe-sweep, --peer-probe-rate; zero
	// values: peerhealth's defaults).
	NoPeerProbe bool
	PeerProbe   peerhealth.Settings

	// KernelResync is how often the kernel is re-listed to repair drift
	// (default 30 s); LeaseResync how often etcd is (default 30 min).
	KernelResync time.Duration
	LeaseResync  time.Duration

	// NetNS is the network namespace to program; a closed handle (the
	// default) means the process's own. Tests run several daemons in one
	// process, each in its own namespace.
	NetNS netns.NsHandle
	// Kernel, if set, replaces the real network stack in NetNS (tests).
	Kernel Kernel
	// Source, if set, is where the leases come from instead of the etcd
	// cluster Etcd and Prefix name (tests; another store). Run owns it
	// once given: it closes it (Source.Close) before it returns, reached
	// or not, after every goroutine using it has ended.
	Source subnet.Source

	// AfterFirstPass, if set, is called once, when every data plane has
	// finished its first reconcile pass (successful or not): the cold
	// start's burst of kernel writes is over. The program ends its
	// start-up settings there (cmd/overlayd: GOMAXPROCS). It must not block.
	AfterFirstPass func()

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
	if c.FlannelSubnetFile == "" {
		c.FlannelSubnetFile = FlannelSubnetFile
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.NetNS == 0 {
		c.NetNS = netns.None()
	}
	if c.Kernel == nil {
		c.Kernel = hostKernel{ns: c.NetNS}
	}
}

// leaseSource is where the leases come from: Source if set, else the etcd
// cluster Etcd and Prefix name, with the lease journal beside the subnet
// file (the host lock makes it this daemon's alone).
func (c *Config) leaseSource(log *slog.Logger) subnet.Source {
	if c.Source != nil {
		return c.Source
	}
	dial := func(ctx context.Context) (*clientv3.Client, error) { return etcdclient.Connect(ctx, c.Etcd) }
	badSettings := func(err error) bool { return errors.Is(err, etcdclient.ErrConfig) }
	return etcdv3.NewSource(etcdv3.SourceConfig{Endpoints: c.Etcd.Endpoints, Dial: dial, DialFatal: badSettings, Prefix: c.Prefix, JournalFile: etcdv3.JournalFile(c.SubnetFile),
		LeaseTTL: c.LeaseTTL, LivenessTTL: c.LivenessTTL, Resync: c.LeaseResync, ConfigRetry: retryInterval, Logger: log})
}

// requestTimeout is how long one request to the lease source may take:
// --dial-timeout for etcd's, etcd's default for a Config.Source.
func (c *Config) requestTimeout() time.Duration {
	if c.Source != nil {
		return etcdclient.DefaultDialTimeout
	}
	return dialTimeout(c.Etcd)
}

// retryInterval is the first pause between attempts of a start-up step
// (it grows: see stepper) and the config watch's pause after an error.
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
	d := &daemon{cfg: cfg, log: cfg.Logger}
	var err error
	if d.nodeID, err = NodeID(cfg.NodeName, cfg.MachineIDFile); err != nil {
		return err
	}
	// One overlayd per host, whatever its flags: the host lock is taken
	// first, then the subnet file's (two hosts must not share one file).
	unlock, err := cfg.Kernel.LockHost()
	if err != nil {
		return lockError(err)
	}
	defer unlock()
	if d.ul, err = cfg.Kernel.Underlay(cfg.Iface, cfg.PublicIP, cfg.PublicIPv6); err != nil {
		return err
	}
	lock, err := lockHost(cfg.SubnetFile)
	switch {
	case errors.Is(err, ErrRunning):
		return lockError(err)
	case err != nil:
		return fmt.Errorf("--subnet-file %s: %w", cfg.SubnetFile, err)
	}
	defer lock.release()
	d.log = d.log.With("node", d.nodeID)
	if cfg.Source != nil {
		d.log.Info("starting", "iface", d.ul.Iface, "public_ip", d.ul.PublicIP, "public_ipv6", d.ul.PublicIPv6, "source", cfg.Source.Where())
	} else {
		d.log.Info("starting", "iface", d.ul.Iface, "public_ip", d.ul.PublicIP, "public_ipv6", d.ul.PublicIPv6, "etcd", cfg.Etcd.Endpoints, "prefix", cfg.Prefix)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer d.shutdown(cancel)
	d.st = &probe{node: d.nodeID, iface: d.ul.Iface, publicIP: d.ul.PublicIP}
	d.m = newMetrics(d.st)
	d.steps = stepper{log: d.log, st: d.st}
	if err := d.serveHealth(ctx); err != nil {
		return err
	}
	if err := d.join(ctx); err != nil {
		return err
	}
	if err := d.startDataPlane(ctx); err != nil {
		if ctx.Err() == nil {
			d.releaseUnserved()
		}
		return err
	}
	return d.loop(ctx)
}

// lockError is what `overlayd run` says when it cannot take a lock.
func lockError(err error) error {
	if errors.Is(err, ErrRunning) {
		// Not "run this one beside it": one host has one overlay (its
		// devices and the nftables table are the same for both).
		return fmt.Errorf("%w: stop it first (systemctl stop overlayd)", err)
	}
	return err
}

// daemon is one run of overlayd: what start-up has built so far, for the
// steps after it, the loop and the shutdown. Its fields are set once, in
// start-up order, by run's goroutine.
type daemon struct {
	// refusedLog remembers the VXLAN guards' refused sources logged.
	refusedLog *refusedLog

	cfg    Config
	log    *slog.Logger
	nodeID string
	ul     Underlay
	st     *probe
	m      *metrics
	steps  stepper

	// Every goroutine the daemon starts is in wg; closers release what
	// they use, in reverse order, once all of them have returned.
	wg      sync.WaitGroup
	closers []func()

	src    subnet.Source
	netCfg *subnet.Config
	codec  backend.Codec // the network's backend's part of lease values (codecs.For)
	lease  subnet.Lease
	snap   subnet.Snapshot // the lease set Acquire returned, which seeds the peers and the watch (dropped once the watch has it)
	// planes are the data planes, one per address family the network
	// carries, IPv4 first: listed once the config is read, built by
	// startDataPlane through Kernel.Plane.
	planes  []*familyPlane
	peers   *peerSet
	env     *envKeeper
	batches <-chan subnet.Batch

	// prober probes the peers through the overlay (nil if
	// Config.NoPeerProbe): one more consumer of the peer set.
	prober *peerhealth.Prober
}

// shutdown stops every goroutine first, then closes what they used (etcd
// client, netlink sockets, nftables), newest first: no goroutine ever runs
// on a closed client.
func (d *daemon) shutdown(cancel context.CancelFunc) {
	cancel()
	d.wg.Wait()
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// serveHealth starts the health and metrics endpoint, if one is wanted.
func (d *daemon) serveHealth(ctx context.Context) error {
	ln, err := healthListener(d.cfg)
	if err != nil || ln == nil {
		return err
	}
	log := d.log // d.log gains the subnet later; the server keeps its own
	d.wg.Go(func() { serveHTTP(ctx, ln, d.st, d.m, log) })
	d.log.Info("serving health and metrics", "addr", ln.Addr())
	return nil
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
