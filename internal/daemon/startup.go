package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// join connects to etcd, reads the network config and acquires this host's
// lease, retrying what waiting can fix.
func (d *daemon) join(ctx context.Context) error {
	var cli *clientv3.Client
	if err := d.steps.retry(ctx, "reach etcd at "+strings.Join(d.cfg.Etcd.Endpoints, ","), func(ctx context.Context) (err error) {
		cli, err = etcdclient.Connect(ctx, d.cfg.Etcd)
		return err
	}); err != nil {
		return err
	}
	d.closers = append(d.closers, func() { _ = cli.Close() })
	d.reg = etcdv3.NewRegistry(cli, d.cfg.Prefix)

	if err := d.steps.retry(ctx, "read the network config", func(ctx context.Context) (err error) {
		if d.netCfg, _, err = d.reg.GetConfig(ctx); err != nil {
			return err
		}
		return d.netCfg.Supported()
	}); err != nil {
		return err
	}

	host := etcdv3.Host{NodeID: d.nodeID, PublicIP: d.ul.PublicIP, VtepMAC: vxlan.VtepMAC(d.nodeID, d.netCfg.Backend.VNI),
		Previous: previousLease(d.cfg.SubnetFile, d.netCfg, d.log)}
	host.Hostname, _ = os.Hostname()
	d.mgr = etcdv3.NewManager(d.reg, d.netCfg, host, etcdv3.ManagerOptions{
		LeaseTTL: d.cfg.LeaseTTL, LivenessTTL: d.cfg.LivenessTTL, Logger: d.log, OnWait: d.st.setPhase})
	// The wait for another host's liveness key is bounded by that key's
	// TTL, not by a per-attempt timeout: it must be allowed to end.
	if err := d.steps.retryUnbounded(ctx, "check that node ID "+strconv.Quote(d.nodeID)+" is not in use", d.mgr.CheckNodeID); err != nil {
		return err
	}
	// Acquire lists every lease to pick a subnet; that listing also seeds
	// the peers and the watch.
	if err := d.steps.retry(ctx, "acquire a lease", func(ctx context.Context) (err error) {
		d.lease, d.snap, err = d.mgr.Acquire(ctx)
		return err
	}); err != nil {
		return err
	}
	d.st.set(func(p *probe) { p.mgr = d.mgr })
	d.log = d.log.With("subnet", d.lease.Subnet)
	return nil
}

// startDataPlane sets up the VXLAN device, starts programming the peers of
// the lease snapshot, installs the masquerade and writes subnet.env.
func (d *daemon) startDataPlane(ctx context.Context) error {
	d.st.setPhase("setting up the VXLAN device")
	nl, closeNL, err := d.cfg.Kernel.OpenNetlink()
	if err != nil {
		return err
	}
	d.closers = append(d.closers, closeNL)
	nc := d.netCfg
	d.be, err = vxlan.New(vxlan.Config{
		VNI: nc.Backend.VNI, Port: nc.Backend.Port, DirectRouting: nc.Backend.DirectRouting, MTU: nc.Backend.MTU,
		Underlay: d.ul.Iface, LocalIP: d.ul.PublicIP, OwnSubnet: d.lease.Subnet, NodeID: d.nodeID,
		ResyncInterval: d.cfg.KernelResync, Logger: d.log, OnPeerProgrammed: d.m.programmed,
	}, nl)
	if err != nil {
		return err
	}
	d.st.set(func(p *probe) { p.be = d.be })
	if d.dev, err = d.be.EnsureDevice(ctx); err != nil {
		return fmt.Errorf("set up the VXLAN device: %w", err)
	}

	// The peers are programmed from here on, while the masquerade table and
	// subnet.env are set up: neither depends on the other, and at a cold
	// start the first pass is most of the time to converge.
	d.peers = newPeerSet(nc, d.lease.Subnet, d.reg.SubnetsPrefix())
	now := time.Now()
	for _, l := range d.snap.Leases {
		d.m.eventArrived(l.Subnet, now)
	}
	d.m.rejected(d.peers.reset(d.snap), d.log)
	d.publishPeers()
	c := d.peers.counts()
	d.log.Info("initial lease set", "peers", len(d.peers.valid), "invalid", c.invalid, "orphaned", c.orphaned, "reserved", c.reserved, "revision", d.snap.Revision)
	d.wg.Go(func() { _ = d.be.Run(ctx) })

	if d.cfg.IPMasq {
		mq, err := d.cfg.Kernel.Masquerade(nc.Network, d.dev.Name, d.log)
		if err != nil {
			return err
		}
		d.closers = append(d.closers, func() { _ = mq.Close() })
		d.wg.Go(func() { _ = mq.Run(ctx) })
	}
	d.env = newEnvKeeper(d.cfg.SubnetFile, subnet.NewEnv(nc.Network, d.lease.Subnet, d.dev.MTU, d.cfg.IPMasq))
	if _, err := d.env.ensure(); err != nil {
		return err
	}
	d.log.Info("lease held and device ready", "device", d.dev.Name, "vtep_mac", d.dev.VtepMAC.String(), "mtu", d.dev.MTU, "subnet_file", d.cfg.SubnetFile)
	return nil
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
