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
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
// place) or the lease is lost or cannot be had (returning the error).
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
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
	log = log.With("node", nodeID)
	log.Info("starting", "iface", ul.Iface, "public_ip", ul.PublicIP, "etcd", cfg.Etcd.Endpoints, "prefix", cfg.Prefix)

	cli, err := etcdclient.New(cfg.Etcd)
	if err != nil {
		return err
	}
	defer cli.Close()
	reg := etcdv3.NewRegistry(cli, cfg.Prefix)

	var netCfg *subnet.Config
	if err := retry(ctx, log, "read the network config", func(ctx context.Context) (err error) {
		netCfg, _, err = reg.GetConfig(ctx)
		return err
	}); err != nil {
		return err
	}

	host := etcdv3.Host{NodeID: nodeID, PublicIP: ul.PublicIP, VtepMAC: vxlan.VtepMAC(nodeID, netCfg.Backend.VNI), Previous: previousLease(cfg.SubnetFile, netCfg, log)}
	host.Hostname, _ = os.Hostname()
	mgr := etcdv3.NewManager(reg, netCfg, host, etcdv3.ManagerOptions{LeaseTTL: cfg.LeaseTTL, Logger: log})
	var lease subnet.Lease
	if err := retry(ctx, log, "acquire a lease", func(ctx context.Context) (err error) {
		lease, err = mgr.Acquire(ctx)
		return err
	}); err != nil {
		return err
	}
	log = log.With("subnet", lease.Subnet)

	nl, err := vxlan.OpenNetlink(cfg.NetNS)
	if err != nil {
		return err
	}
	defer nl.Close()
	be, err := vxlan.New(vxlan.Config{
		VNI: netCfg.Backend.VNI, Port: netCfg.Backend.Port, DirectRouting: netCfg.Backend.DirectRouting, MTU: netCfg.Backend.MTU,
		Underlay: ul.Iface, LocalIP: ul.PublicIP, OwnSubnet: lease.Subnet, NodeID: nodeID,
		ResyncInterval: cfg.KernelResync, Logger: log,
	}, nl)
	if err != nil {
		return err
	}
	dev, err := be.EnsureDevice(ctx)
	if err != nil {
		return fmt.Errorf("set up the VXLAN device: %w", err)
	}
	env := subnet.NewEnv(netCfg.Network, lease.Subnet, dev.MTU, false)
	if err := subnet.WriteEnv(cfg.SubnetFile, env); err != nil {
		return err
	}
	log.Info("lease held and device ready", "device", dev.Name, "vtep_mac", dev.VtepMAC, "mtu", dev.MTU, "subnet_file", cfg.SubnetFile)

	var snap etcdv3.Snapshot
	if err := retry(ctx, log, "list leases", func(ctx context.Context) (err error) {
		snap, err = reg.List(ctx)
		return err
	}); err != nil {
		return err
	}
	peers := newPeerSet(netCfg, lease.Subnet, reg.SubnetsPrefix())
	logRejections(log, peers.reset(snap))
	be.SetPeers(peers.peers())
	log.Info("initial lease set", "peers", len(peers.valid), "rejected", peers.rejected(), "revision", snap.Revision)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	fatal := make(chan error, 1)
	wg.Go(func() { _ = be.Run(ctx) })
	wg.Go(func() {
		if err := mgr.Run(ctx); err != nil {
			fatal <- err
		}
	})
	batches := reg.Watch(ctx, snap, etcdv3.WatchOptions{ResyncInterval: cfg.LeaseResync, Logger: log})
	envCheck := time.NewTicker(5 * time.Second)
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
			logRejections(log, peers.apply(b))
			be.SetPeers(peers.peers())
		case <-envCheck.C:
			// The device MTU follows the underlay's; pods must learn it.
			if mtu := be.Status().MTU; mtu > 0 && mtu != env.MTU {
				env.MTU = mtu
				if err := subnet.WriteEnv(cfg.SubnetFile, env); err != nil {
					log.Error("rewrite subnet.env", "err", err)
				} else {
					log.Info("subnet.env rewritten", "mtu", mtu)
				}
			}
		}
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

// retry runs fn until it succeeds, ctx ends, or the error is one waiting
// cannot fix (no free subnet, lease lost). Each attempt gets its own
// timeout, so an unreachable etcd is retried rather than waited on forever.
func retry(ctx context.Context, log *slog.Logger, what string, fn func(context.Context) error) error {
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(actx)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info("succeeded after retrying", "what", what, "attempts", attempt)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, subnet.ErrOutOfSubnets), errors.Is(err, etcdv3.ErrLeaseLost), errors.Is(err, etcdclient.ErrConfig):
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Since(lastLog) > 30*time.Second {
			log.Error("cannot "+what+", retrying", "err", err, "attempt", attempt)
			lastLog = time.Now()
		}
		t := time.NewTimer(retryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
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

func logRejections(log *slog.Logger, rs []rejection) {
	for _, r := range rs {
		log.Warn("skipping invalid lease", "key", r.Key, "err", r.Err)
	}
}
