package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/guard"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/internal/lib/backoff"
	"github.com/overlaynet/overlay/subnet"
)

// join reaches the lease source, reads the network config and acquires
// this host's lease, retrying what waiting can fix.
func (d *daemon) join(ctx context.Context) error {
	src := d.cfg.leaseSource(d.log)
	// Last to close, whether or not it was reached (the daemon owns a
	// Config.Source it is given): a start-up that fails after the claim
	// frees the node ID at once (a no-op once Keep runs: it releases its
	// own).
	d.closers = append(d.closers, src.Close)
	d.steps.fatal = src.IsFatal
	if err := d.steps.retry(ctx, stepReach+src.Where(), src.Connect); err != nil {
		return err
	}
	d.src = src

	if err := d.steps.retry(ctx, stepReadConfig, func(ctx context.Context) (err error) {
		d.netCfg, err = src.Config(ctx)
		return err
	}); err != nil {
		return err
	}
	switch {
	case d.netCfg.EnableIPv4 && !d.ul.PublicIP.IsValid():
		return fmt.Errorf("the network carries IPv4, but interface %s has no global IPv4 address: set --public-ip or choose another --iface", d.ul.Iface)
	case d.netCfg.EnableIPv6 && !d.ul.PublicIPv6.IsValid():
		return fmt.Errorf("the network carries IPv6 (EnableIPv6 in %s), but interface %s has no global IPv6 address: give it one, set --public-ipv6, or choose another --iface", src.ConfigKey(), d.ul.Iface)
	}
	if err := checkUnderlayOutside(d.netCfg, d.ul, src.ConfigKey()); err != nil {
		return err
	}
	codec, err := codecs.For(d.netCfg.Backend)
	if err != nil {
		return fmt.Errorf("%s: %w", src.ConfigKey(), err)
	}
	d.codec = codec
	for _, fam := range families(d.netCfg) {
		d.planes = append(d.planes, &familyPlane{family: fam})
	}
	if err := d.findFlannel(); err != nil {
		return err
	}
	// Nothing is published that this host cannot serve.
	if err := d.cfg.Kernel.CheckDataPath(d.dataPath()); err != nil {
		return err
	}

	host := d.host()
	// The wait for another host's liveness key is bounded by that key's
	// TTL, not by a per-attempt timeout: it must be allowed to end.
	if err := d.steps.retryUnbounded(ctx, stepClaimNodeID+strconv.Quote(d.nodeID), func(ctx context.Context) error {
		return src.Claim(ctx, d.netCfg, host, d.st.setPhase)
	}); err != nil {
		return err
	}
	// The lease set saved by the last run, if the store still holds it,
	// or else a listing of every lease, seeds the peers and the watch.
	if err := d.steps.retry(ctx, stepAcquire, func(ctx context.Context) (err error) {
		d.lease, d.snap, err = src.Acquire(ctx)
		return err
	}); err != nil {
		return err
	}
	d.st.set(func(p *probe) { p.held, p.store = src.Held(), src.Name() })
	if err := d.checkFlannelSubnets(); err != nil {
		d.releaseUnserved()
		return err
	}
	if d.lease.Subnet.IsValid() {
		d.log = d.log.With("subnet", d.lease.Subnet)
	}
	if d.lease.IPv6Subnet.IsValid() {
		d.log = d.log.With("ipv6_subnet", d.lease.IPv6Subnet)
	}
	return nil
}

// host is this host as its lease names it: the value it publishes, with
// each family's plane's data of its device (publishedData), and the
// subnets of an old subnet.env.
func (d *daemon) host() subnet.Host {
	nc := d.netCfg
	h := subnet.Host{NodeID: d.nodeID, PublicIP: d.ul.PublicIP, PublicIPv6: d.ul.PublicIPv6,
		Previous: previousLease(d.cfg.SubnetFile, nc, d.log)}
	h.Hostname, _ = os.Hostname()
	var data, data6 json.RawMessage // of the families nc carries
	if nc.EnableIPv4 {
		data = d.publishedData(backend.IPv4)
	}
	if nc.EnableIPv6 {
		data6 = d.publishedData(backend.IPv6)
	}
	return h.Publishing(nc, data, data6)
}

// checkUnderlayOutside refuses to start a host whose public address of a
// family lies inside the network of that family: every host, this one
// included, would skip its lease (its VXLAN packets would be routed into
// the overlay itself), and it would program no peer.
func checkUnderlayOutside(cfg *subnet.Config, ul Underlay, configKey string) error {
	for _, a := range []struct {
		addr netip.Addr
		flag string
	}{{ul.PublicIP, "--public-ip"}, {ul.PublicIPv6, "--public-ipv6"}} {
		network := cfg.NetworkHolding(a.addr) // "Network 10.244.0.0/16"
		if !a.addr.IsValid() || network == "" {
			continue
		}
		field, _, _ := strings.Cut(network, " ")
		return fmt.Errorf("this host's public address %s (interface %s) is inside %s of %s: every host would skip its lease, as VXLAN to it would be routed into the overlay; store a config whose %s holds no host's underlay address (`overlayd config put`), or give this host another %s",
			a.addr, ul.Iface, network, configKey, field, a.flag)
	}
	return nil
}

// releaseUnserved gives up the lease this start created, when the start
// failed before the data path was in place: kept, it would have every
// peer route pods' traffic to a host that cannot receive it, for the
// lease's TTL. A lease this host held before (adopted, resumed, a
// reservation, or re-keyed to add or drop its IPv6 subnet) is kept: pods
// may hold addresses from it.
func (d *daemon) releaseUnserved() {
	if d.src == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.requestTimeout())
	defer cancel()
	released, err := d.src.Release(ctx)
	if !released {
		return
	}
	if err != nil {
		d.log.Warn("start-up failed before the data path was in place, and the lease it claimed could not be released; it expires after its TTL, or run `overlayd lease revoke SUBNET`", "err", err)
		return
	}
	d.log.Info("start-up failed before the data path was in place: released the lease it claimed")
}

// startDataPlane sets up the data planes (one per address family the
// network carries), starts programming the peers of the lease snapshot,
// installs the masquerade and writes subnet.env.
func (d *daemon) startDataPlane(ctx context.Context) error {
	d.st.setPhase(phaseDevices)
	nc := d.netCfg
	onPass := firstPasses(len(d.planes), d.cfg.AfterFirstPass)
	for i, fp := range d.planes {
		// Event latency is measured on the first plane: a peer's subnets
		// arrive in one event, named by its primary subnet.
		var onProgrammed func(backend.Peer, time.Time)
		if i == 0 {
			onProgrammed = d.m.programmed
		}
		if err := d.buildPlane(ctx, fp, onProgrammed, onPass[i]); err != nil {
			return err
		}
	}
	if nc.EnableIPv4 && !nc.EnableIPv6 {
		d.removeOldIPv6(ctx)
		d.removeOldGuardFamily(backend.IPv6)
	}
	if !nc.EnableIPv4 {
		d.removeOldGuardFamily(backend.IPv4)
	}
	if !d.cfg.VXLANGuard {
		d.removeOldGuard()
	}

	// The peers are programmed from here on, while the masquerade table and
	// subnet.env are set up: neither depends on the other, and at a cold
	// start the first pass is most of the time to converge.
	d.peers = newPeerSet(nc, d.codec, d.lease.Subnets(), d.src.LeaseName)
	d.newProber()
	d.seedPeers(time.Now())
	d.watchLeases(ctx)
	// The peer set, the journal and the watch have what they need of the
	// listing's leases: with many leases they are megabytes, and the
	// backend's copies of the peers are made next. Collected now, once,
	// the heap the first pass grows (the backend's view of the kernel and
	// its copy of the peers) starts from the peers alone rather than from
	// the peers and the listing: 0.6 MB less peak RSS at a cold start of
	// 5,000 peers, for about a millisecond of CPU (Documentation/
	// benchmarks.md, issue 33).
	d.snap.Leases, d.snap.Invalid = nil, nil
	runtime.GC()
	if err := d.catchUp(ctx); err != nil {
		return err
	}
	d.publishPeers()
	c := d.peers.counts()
	d.log.Info("initial lease set", "peers", d.peers.size(), "invalid", c.invalid, "orphaned", c.orphaned, "reserved", c.reserved, "ipv4_only", c.ipv4Only, "revision", d.snap.Revision, "saved", d.snap.Saved)
	d.snap = subnet.Snapshot{} // the watch has what it needs; with many leases the listing is megabytes
	for _, fp := range d.planes {
		d.wg.Go(func() { _ = fp.plane.Run(ctx) })
	}
	if d.prober != nil {
		d.wg.Go(func() { _ = d.prober.Run(ctx) })
	}

	if d.cfg.IPMasq {
		mq, err := d.cfg.Kernel.Masquerade(d.masqNetworks(), d.log)
		if err != nil {
			return err
		}
		d.closers = append(d.closers, func() { _ = mq.Close() })
		d.removeFlannelMasq(mq)
		d.wg.Go(func() { _ = mq.Run(ctx) })
	} else {
		d.removeOldMasq()
	}
	env := subnet.Env{MTU: d.podMTU(), IPMasq: d.cfg.IPMasq}
	if nc.EnableIPv4 {
		env = subnet.NewEnv(nc.Network, d.lease.Subnet, env.MTU, env.IPMasq)
	}
	if nc.EnableIPv6 {
		env = env.WithIPv6(nc.IPv6.Network, d.lease.IPv6Subnet)
	}
	d.env = newEnvKeeper(d.cfg.SubnetFile, d.cfg.SubnetFileFormat, env)
	if _, err := d.env.ensure(); err != nil {
		return err
	}
	for _, fp := range d.planes {
		dev := fp.dev
		d.log.Info("lease held and device ready", "device", dev.Name, "vtep_mac", dev.MAC.String(), "mtu", dev.MTU, "subnet_file", d.cfg.SubnetFile)
	}
	return nil
}

// seedPeers fills the peer set from the lease snapshot, and records that
// each peer's lease arrived at now, for the event latency measured when it
// is programmed. Only peers are recorded: the own lease, a reservation, an
// invalid or orphaned lease is never programmed, and an arrival of one
// would stay pending for good, keeping the map of a cold start's
// thousands of arrivals resident.
func (d *daemon) seedPeers(now time.Time) {
	rejected := d.peers.reset(d.snap)
	arrived := make([]arrivalKey, 0, d.peers.size())
	for _, l := range d.snap.Leases {
		if d.peers.isPeer(l.ID()) {
			arrived = append(arrived, arrivalKeyOf(l.Subnets().Primary()))
		}
	}
	d.m.listingArrived(arrived, now)
	d.m.rejected(rejected, d.log)
}

// removeOldIPv6 removes the IPv6 data path a run in a network that carried
// IPv6 left (Shutdown keeps the data path): the device overlay-v6.<VNI>
// with its routes, neighbours and FDB entries. Once the network stops
// carrying IPv6 nothing manages them: left in place, they would go on
// sending IPv6 pod traffic to peers that dropped theirs. A failure cannot
// stop the start (the IPv4 data path does not depend on it); it says what
// to remove by hand.
func (d *daemon) removeOldIPv6(ctx context.Context) {
	name, err := planeDevice(d.netCfg.Backend, backend.IPv6)
	if err != nil {
		d.log.Warn("the network no longer carries IPv6: the IPv6 device of an earlier run, if any, is left in place", "err", err)
		return
	}
	spec := PlaneSpec{Backend: d.netCfg.Backend, Family: backend.IPv6, Underlay: d.ul.Iface, LocalIP: d.ul.PublicIPv6, NodeID: d.nodeID, Logger: d.log}
	warn := func(err error) {
		d.log.Warn("the network no longer carries IPv6, but the IPv6 device of an earlier run could not be removed: delete it with `ip link delete "+name+"` (its routes, neighbours and FDB entries go with it)",
			"device", name, "err", err)
	}
	switch _, found, err := d.cfg.Kernel.LinkMAC(name); {
	case err != nil:
		warn(err)
		return
	case !found:
		return
	}
	be, closePlane, err := d.cfg.Kernel.Plane(spec)
	if err == nil {
		err = be.Teardown(ctx)
		closePlane()
	}
	if err != nil {
		warn(err)
		return
	}
	d.log.Info("the network no longer carries IPv6: removed the IPv6 device of an earlier run with its routes, neighbours and FDB entries", "device", name, "config", d.src.ConfigKey())
}

// removeOldMasq deletes the masquerade table a run with --ip-masq left
// (Shutdown keeps it, so that a restart opens no window without NAT):
// without it a host switched to --ip-masq=false would go on masquerading
// while subnet.env tells the bridge plugin to. It cannot stop the start:
// a kernel without nftables, one reason for --ip-masq=false, has no table.
func (d *daemon) removeOldMasq() {
	removed, err := d.cfg.Kernel.RemoveMasquerade()
	switch {
	case err != nil:
		d.log.Warn("--ip-masq=false: cannot check for the masquerade table of an earlier run with --ip-masq; if there is one, delete it with `nft delete table inet overlay`", "table", "inet "+masq.TableName, "err", err)
	case removed:
		d.log.Info("--ip-masq=false: removed the masquerade table of an earlier run with --ip-masq", "table", "inet "+masq.TableName)
	}
}

// removeOldGuard deletes the VXLAN guard table a run with --vxlan-guard
// left (Shutdown keeps it, so that a restart opens no gap): nothing would
// admit new peers to it, and their VXLAN traffic would be dropped. It
// cannot stop the start: a kernel without nftables has no table.
func (d *daemon) removeOldGuard() {
	removed, err := d.cfg.Kernel.RemoveGuard()
	switch {
	case err != nil:
		d.log.Warn("--vxlan-guard=false: cannot check for the VXLAN guard table of an earlier run; if there is one, delete it with `nft delete table inet "+guard.TableName+"`, or it drops the VXLAN traffic of new peers", "err", err)
	case removed:
		d.log.Info("--vxlan-guard=false: removed the VXLAN guard table of an earlier run", "table", "inet "+guard.TableName)
	}
}

// removeOldGuardFamily deletes the sets and chain of family fam of the
// VXLAN guard a run in a network that carried fam left: nothing keeps
// them any more. Harmless if left (no VXLAN device of fam listens), so a
// failure only warns.
func (d *daemon) removeOldGuardFamily(fam backend.Family) {
	removed, err := d.cfg.Kernel.RemoveGuardFamily(fam)
	switch {
	case err != nil:
		d.log.Warn(fmt.Sprintf("the network no longer carries %v, but the %v part of the VXLAN guard of an earlier run could not be removed: `nft delete chain inet %s %s; nft delete set inet %s %s; nft delete set inet %s %s`",
			fam, fam, guard.TableName, guard.ChainName(fam), guard.TableName, guard.SetName(fam), guard.TableName, guard.RefusedSetName(fam)), "err", err)
	case removed:
		d.log.Info(fmt.Sprintf("the network no longer carries %v: removed the %v sets and chain of the VXLAN guard", fam, fam), "table", "inet "+guard.TableName)
	}
}

// buildPlane builds one family's data plane through the Kernel's factory
// for the lease's subnet of that family, and sets up its device:
// flanneld's device, if one is being taken over, with the routes flanneld
// left on it.
func (d *daemon) buildPlane(ctx context.Context, fp *familyPlane, onProgrammed func(backend.Peer, time.Time), onPass func()) error {
	nc := d.netCfg
	var gate backend.Gate
	if d.cfg.VXLANGuard {
		g, err := d.cfg.Kernel.Guard(fp.family, nc.Backend.Port, d.log)
		if err != nil {
			return err
		}
		d.closers = append(d.closers, func() { _ = g.Close() })
		fp.guard, gate = g, g
		d.st.set(func(p *probe) { p.guards = append(p.guards, g) })
	}
	be, closePlane, err := d.cfg.Kernel.Plane(PlaneSpec{
		Backend: nc.Backend, Family: fp.family, Underlay: d.ul.Iface, LocalIP: d.ul.localIP(fp.family),
		OwnSubnet: ownSubnet(d.lease, fp.family), NodeID: d.nodeID, Device: fp.flannel.name, MAC: fp.flannel.mac,
		Resync: d.cfg.KernelResync, Logger: d.log, OnPeerProgrammed: onProgrammed, OnPass: onPass, Gate: gate,
	})
	if err != nil {
		return err
	}
	d.closers = append(d.closers, closePlane)
	fp.plane = be
	d.st.set(func(p *probe) { p.planes = append(p.planes, be) })
	if fp.dev, err = be.EnsureDevice(ctx); err != nil {
		return fmt.Errorf("set up the VXLAN device: %w", err)
	}
	return d.adoptFlannelRoutes(ctx, be, fp.flannel)
}

// masqNetworks are the cluster networks to masquerade traffic out of, each
// with its device.
func (d *daemon) masqNetworks() []masq.Network {
	var out []masq.Network
	for _, fp := range d.planes {
		out = append(out, masq.Network{Prefix: network(d.netCfg, fp.family), Device: fp.dev.Name})
	}
	return out
}

// previousLease returns the subnets of an old subnet.env that fit the
// network; the manager reuses each only if no one holds it.
func previousLease(path string, cfg *subnet.Config, log *slog.Logger) subnet.Subnets {
	env, err := subnet.ReadEnv(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("ignoring the previous subnet file", "err", err)
		}
		return subnet.Subnets{}
	}
	var prev subnet.Subnets
	if cfg.EnableIPv4 && cfg.Contains(env.Lease()) {
		prev.IPv4 = env.Lease()
	}
	if cfg.EnableIPv6 && cfg.IPv6.Contains(env.IPv6Lease()) {
		prev.IPv6 = env.IPv6Lease()
	}
	return prev
}

// stepper runs the steps of start-up that wait for something, keeping
// readiness's "startup" reason true to what is being waited for.
type stepper struct {
	log *slog.Logger
	st  *probe
	// fatal says which errors of the lease source waiting cannot fix
	// (subnet.Source.IsFatal); nil before the source is known.
	fatal func(error) bool
}

// Start-up steps are paced by a backoff.Backoff: an attempt may take
// attemptTimeout at first, twice as long after each attempt that ran out of
// time (a fleet restarting at once makes etcd slow; a fixed bound would
// throw away every host's listing again and again), up to
// maxAttemptTimeout; the pause after a failure starts near retryInterval
// and doubles up to maxRetryPause, at random within ±50 % each time.
//
// The first bound is long enough for a listing in a fleet-wide restart
// (2,000 hosts listing 2,000 leases at once took up to ~20 s on the
// machine of Documentation/scale.md): a shorter one throws that work away
// when it is nearly done, and the retries make etcd slower still. A
// request on a dead connection does not need it: gRPC keepalive drops the
// connection within 15 s and the etcd client retries on another member.
const (
	attemptTimeout    = 30 * time.Second
	maxAttemptTimeout = 240 * time.Second
	maxRetryPause     = 16 * time.Second
)

// retry runs fn until it succeeds, ctx ends, or the error is one waiting
// cannot fix (no free subnet, lease lost, duplicate node ID, stranded
// lease, bad client settings).
func (s stepper) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return s.run(ctx, what, StartupBackoff(), fn)
}

// StartupBackoff is the schedule of one start-up step whose attempts are
// bounded. tools/scale paces its simulated hosts' start with it.
func StartupBackoff() *backoff.Backoff {
	return backoff.New(attemptTimeout, maxAttemptTimeout, retryInterval, maxRetryPause)
}

// retryUnbounded is retry for a step that bounds its own waits.
func (s stepper) retryUnbounded(ctx context.Context, what string, fn func(context.Context) error) error {
	return s.run(ctx, what, backoff.New(0, 0, retryInterval, maxRetryPause), fn)
}

func (s stepper) run(ctx context.Context, what string, b *backoff.Backoff, fn func(context.Context) error) error {
	var lastLog time.Time
	s.st.setPhase(phaseTrying + what)
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if timeout := b.Timeout(); timeout > 0 {
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
		case s.fatalAtStart(err):
			return fmt.Errorf("%s: %w", what, err)
		}
		s.st.setPhase(phaseWaiting + what + ": " + err.Error())
		if time.Since(lastLog) >= backoff.WarnEvery {
			s.log.Error("cannot "+what+", retrying", "err", err, "attempt", attempt)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.Failed(err)):
		}
	}
}

// fatalAtStart: no free subnet, or an error of the lease source that
// waiting cannot fix (etcd: bad client settings, the lease lost, a
// duplicate node ID, a stranded lease).
func (s stepper) fatalAtStart(err error) bool {
	return errors.Is(err, subnet.ErrOutOfSubnets) || s.fatal != nil && s.fatal(err)
}

// firstPasses returns one OnPass hook for each of n planes: once every
// plane's hook has been called, done is called, once. Nil hooks if done is
// nil.
func firstPasses(n int, done func()) []func() {
	hooks := make([]func(), n)
	if done == nil {
		return hooks
	}
	var left atomic.Int32
	left.Store(int32(n))
	for i := range hooks {
		var passed atomic.Bool
		hooks[i] = func() {
			if !passed.Swap(true) && left.Add(-1) == 0 {
				done()
			}
		}
	}
	return hooks
}
