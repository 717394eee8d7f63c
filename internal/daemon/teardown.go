package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TeardownResult says what Teardown found and removed: only what was
// actually there is reported as removed.
type TeardownResult struct {
	// Device is the IPv4 VXLAN device looked for (overlay.<VNI>); "" if
	// teardown stopped before it looked.
	Device string
	// Removed are the data planes' devices that existed and were removed
	// with their routes, neighbours and FDB entries, one entry per plane:
	// overlayd's of each family, IPv4 first, then flanneld's that
	// overlayd had taken over (--adopt-flannel).
	Removed      []RemovedDevice
	MasqRemoved  bool   // overlayd's nftables table existed and was removed
	GuardRemoved bool   // the VXLAN guard's nftables table existed and was removed
	LeaseRemoved string // the subnet whose lease key was deleted, if any
	LeaseKept    string // why no lease was deleted, if none was
	SubnetFile   string // subnet.env, if it existed and was removed
	// Warnings name what was left in place, and why (also logged).
	Warnings []string
}

// RemovedDevice is one data plane's device that teardown removed.
type RemovedDevice struct {
	Name      string
	Family    backend.Family
	TakenOver bool // flanneld's device, taken over by overlayd
}

// ErrLeaseNotReleased means teardown removed what it could on this host but
// could not reach etcd to release the lease.
var ErrLeaseNotReleased = errors.New("lease not released")

// TeardownOptions tune Teardown.
type TeardownOptions struct {
	// VNI names the device to remove when etcd cannot be reached.
	VNI int
	// Force tears down even while an overlayd runs on this host (it
	// rebuilds everything it owns within seconds).
	Force bool
}

// Teardown removes this host's data path (routes, neighbours, FDB entries,
// the VXLAN device), its lease in etcd (a reservation is kept: an operator
// made it) and subnet.env. The underlay it needs only for the routes of
// DirectRouting through it: if it cannot be found, those stay, named in
// the result's Warnings. It refuses (ErrRunning) while `overlayd run`
// holds this host's lock, unless opts.Force. The data path and subnet.env
// are removed even when etcd cannot be reached (the device is found by
// opts.VNI then); the error then wraps ErrLeaseNotReleased.
func Teardown(ctx context.Context, cfg Config, opts TeardownOptions) (TeardownResult, error) {
	cfg.defaults()
	var res TeardownResult
	release, err := lockForTeardown(cfg, opts.Force)
	if err != nil {
		return res, err
	}
	// Held while tearing down: a daemon starting now refuses.
	defer release()
	nodeID, err := NodeID(cfg.NodeName, cfg.MachineIDFile)
	if err != nil {
		return res, err
	}
	ul, ulErr := cfg.Kernel.TeardownUnderlay(cfg.Iface, cfg.PublicIP, cfg.PublicIPv6)
	if errors.Is(ulErr, errNoNetlink) {
		return res, ulErr // nothing on this host can be removed: leave the lease too
	}
	if ulErr != nil {
		w := fmt.Sprintf("underlay interface not found (%v): routes of DirectRouting through it are left in place; delete them with `ip route flush proto %d` and `ip -6 route flush proto %[2]d`", ulErr, ownRouteProtocol)
		cfg.Logger.Warn(w)
		res.Warnings = append(res.Warnings, w)
	}

	var reg *etcdv3.Registry
	var netCfg *subnet.Config
	// Each request may take --dial-timeout, as in the daemon and the CLI:
	// a fixed, shorter bound gave up on an etcd they reach.
	dial := dialTimeout(cfg.Etcd)
	cctx, cancel := context.WithTimeout(ctx, dial)
	cli, etcdErr := etcdclient.Connect(cctx, cfg.Etcd)
	cancel()
	if etcdErr == nil {
		defer cli.Close()
		reg = etcdv3.NewRegistry(cli, cfg.Prefix)
		cctx, cancel := context.WithTimeout(ctx, dial)
		netCfg, _, etcdErr = reg.GetConfig(cctx)
		cancel()
	}
	// The planes to tear down are the stored network's backend's; without
	// etcd, the default backend's of opts.VNI.
	be := subnet.BackendConfig{Type: subnet.DefaultBackendType, VNI: opts.VNI}
	if etcdErr != nil {
		cfg.Logger.Warn("etcd unusable: removing what is on this host; the lease stays until its TTL runs out", "err", etcdErr, "vni", be.VNI)
	} else {
		be = netCfg.Backend
	}

	if err := teardownDevices(ctx, cfg, ul, nodeID, be, &res); err != nil {
		return res, err
	}
	// From here on a failure leaves the rest to do all the same: a
	// teardown removes what it can and reports every failure.
	var errs []error
	if res.MasqRemoved, err = cfg.Kernel.RemoveMasquerade(); err != nil {
		errs = append(errs, err)
	}
	if res.GuardRemoved, err = cfg.Kernel.RemoveGuard(); err != nil {
		errs = append(errs, err)
	}
	switch err := os.Remove(cfg.SubnetFile); {
	case err == nil:
		res.SubnetFile = cfg.SubnetFile
	case !errors.Is(err, fs.ErrNotExist):
		errs = append(errs, fmt.Errorf("remove %s: %w", cfg.SubnetFile, err))
	}
	// The lease journal beside it describes a lease about to be released.
	if err := os.Remove(etcdv3.JournalFile(cfg.SubnetFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove the lease journal: %w", err))
	}
	if etcdErr != nil {
		errs = append(errs, fmt.Errorf("%w: etcd unusable: %w: it expires after its TTL (--lease-ttl), or run `overlayd lease revoke SUBNET` once etcd answers", ErrLeaseNotReleased, etcdErr))
	} else if err := releaseLease(ctx, reg.For(netCfg), nodeID, ul, max(releaseTimeout, dial), &res); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrLeaseNotReleased, err))
	}
	return res, errors.Join(errs...)
}

// lockForTeardown takes the host lock, then the subnet file's, as
// `overlayd run` takes them, and returns what releases those it got. While
// a daemon holds them it refuses, unless force.
func lockForTeardown(cfg Config, force bool) (release func(), err error) {
	release = func() {}
	unlock, err := cfg.Kernel.LockHost()
	if err == nil {
		release = unlock
		var lock *hostLock
		if lock, err = lockHost(cfg.SubnetFile); err == nil {
			release = func() { lock.release(); unlock() }
		}
	}
	switch {
	case errors.Is(err, ErrRunning) && !force:
		release()
		return nil, fmt.Errorf("%w: stop it first (systemctl stop overlayd), or pass --force to tear down under it (it rebuilds what it owns within seconds)", err)
	case err != nil && !errors.Is(err, ErrRunning):
		release()
		return nil, err
	}
	return release, nil
}

// dialTimeout is how long one etcd request may take (--dial-timeout).
func dialTimeout(c etcdclient.Config) time.Duration {
	if c.DialTimeout > 0 {
		return c.DialTimeout
	}
	return etcdclient.DefaultDialTimeout
}

// teardownUnderlay is Kernel.TeardownUnderlay of the host's kernel,
// through h: unlike a start it does not need the link up, an address on
// it or a default route. It finds the link, whose DirectRouting routes are
// overlayd's, and the public address, by which a lease without a node ID
// (flanneld's) is found.
func teardownUnderlay(h *netlink.Handle, iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	ul, err := DetectUnderlay(h, iface, publicIP, publicIPv6)
	if err == nil {
		return ul, nil
	}
	ul = Underlay{PublicIP: publicIP, PublicIPv6: publicIPv6}
	var link netlink.Link
	switch {
	case iface != "":
		link, err = h.LinkByName(iface)
	case publicIP.IsValid():
		link, err = linkWithAddr(h, publicIP)
	default:
		link, err = defaultRouteLink(h)
	}
	if err != nil {
		return ul, err
	}
	ul.Iface, ul.Index = link.Attrs().Name, link.Attrs().Index
	if !ul.PublicIP.IsValid() {
		for _, a := range addrsOf(h, link, unix.AF_INET) {
			if a.IsGlobalUnicast() {
				ul.PublicIP = a
				break
			}
		}
	}
	return ul, nil
}

// teardownDevices removes the data path of each family through the
// Kernel's planes, as `overlayd run` builds them for the network's
// backend b: overlayd's devices and, if overlayd took them over,
// flanneld's, with their routes, neighbours and FDB entries.
func teardownDevices(ctx context.Context, cfg Config, ul Underlay, nodeID string, b subnet.BackendConfig, res *TeardownResult) error {
	dev4, err := planeDevice(b, backend.IPv4)
	if err != nil {
		return err
	}
	dev6, err := planeDevice(b, backend.IPv6)
	if err != nil {
		return err
	}
	res.Device = dev4
	existed := hasLink(cfg.Kernel, res.Device)
	spec := func(fam backend.Family, dev, device string) PlaneSpec {
		// Without an underlay each plane is given its own device as one:
		// it then finds no routes but those on the device.
		return PlaneSpec{Backend: b, Family: fam,
			Underlay: cmp.Or(ul.Iface, dev), LocalIP: ul.localIP(fam), NodeID: nodeID, Device: device, Logger: cfg.Logger}
	}
	// The IPv4 data path is torn down in any case (its routes may outlive
	// the device), the IPv6 one if its device exists.
	if err := teardownPlane(ctx, cfg, spec(backend.IPv4, res.Device, "")); err != nil {
		return err
	}
	if existed {
		res.Removed = append(res.Removed, RemovedDevice{Name: res.Device, Family: backend.IPv4})
	}
	if hasLink(cfg.Kernel, dev6) {
		if err := teardownPlane(ctx, cfg, spec(backend.IPv6, dev6, "")); err != nil {
			return err
		}
		res.Removed = append(res.Removed, RemovedDevice{Name: dev6, Family: backend.IPv6})
	}
	// flanneld's devices, if overlayd took them over (--adopt-flannel).
	for _, fam := range []backend.Family{backend.IPv4, backend.IPv6} {
		name := flannelDeviceName(fam, b.VNI)
		if !cfg.Kernel.TakenOver(name, fam) {
			continue
		}
		if err := teardownPlane(ctx, cfg, spec(fam, name, name)); err != nil {
			return err
		}
		res.Removed = append(res.Removed, RemovedDevice{Name: name, Family: fam, TakenOver: true})
	}
	return nil
}

// hasLink reports whether the link called name exists.
func hasLink(k Kernel, name string) bool {
	_, ok, err := k.LinkMAC(name)
	return ok && err == nil
}

// teardownPlane removes one plane's device, routes, neighbours and FDB
// entries.
func teardownPlane(ctx context.Context, cfg Config, spec PlaneSpec) error {
	be, closePlane, err := cfg.Kernel.Plane(spec)
	if err != nil {
		return err
	}
	defer closePlane()
	if err := be.Teardown(ctx); err != nil {
		return fmt.Errorf("remove the data path: %w", err)
	}
	return nil
}

// releaseTimeout bounds releasing the lease (a listing, a delete, a
// revoke) unless the dial timeout is longer.
const releaseTimeout = 10 * time.Second

// releaseLease deletes the lease key that names this host, unless it is a
// reservation, and revokes its etcd lease. A lease outside the network (one
// a config change stranded) is released too: it is this host's all the same.
func releaseLease(ctx context.Context, reg *etcdv3.Registry, nodeID string, ul Underlay, timeout time.Duration, res *TeardownResult) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	snap, err := reg.List(ctx)
	if err != nil {
		return fmt.Errorf("find this host's lease: %w", err)
	}
	var removed, kept []string
	for _, l := range snap.Leases {
		if !l.Attrs.OwnedBy(nodeID, ul.PublicIP, ul.PublicIPv6) {
			continue
		}
		if l.Reserved {
			kept = append(kept, fmt.Sprintf("%s is a reservation (remove it with `overlayd lease revoke %s`)", l.Subnets(), l.Subnets().Primary()))
			continue
		}
		ok, err := reg.DeleteIfOwned(ctx, l.Subnets(), l.ModRevision)
		if err != nil {
			return err
		}
		if !ok {
			kept = append(kept, fmt.Sprintf("%s changed while tearing down (another host took it?)", l.Subnets()))
			continue
		}
		removed = append(removed, l.Subnets().String())
		// The key is gone either way; an etcd lease left behind just expires.
		_, _ = reg.Client().Revoke(ctx, clientv3.LeaseID(l.EtcdLease))
	}
	if len(removed)+len(kept) == 0 {
		kept = append(kept, "no lease names this host")
	}
	res.LeaseRemoved, res.LeaseKept = strings.Join(removed, ", "), strings.Join(kept, "; ")
	return nil
}

// removeMasq deletes overlayd's nftables table in ns (closed: the
// process's), and the table of older versions, and reports whether there
// was one.
func removeMasq(ns netns.NsHandle) (bool, error) {
	var opts []masq.Option
	if ns.IsOpen() {
		opts = append(opts, masq.WithNetNS(ns))
	}
	// The network is irrelevant to removal; any valid prefix will do.
	mq, err := masq.New(netip.MustParsePrefix("10.0.0.0/8"), opts...)
	if err != nil {
		return false, err
	}
	defer mq.Close()
	rules, err := mq.Rules()
	if err != nil {
		return false, fmt.Errorf("list the nftables table %q: %w", masq.TableName, err)
	}
	if rules == nil {
		return false, nil
	}
	if err := mq.Remove(); err != nil {
		return false, fmt.Errorf("remove the nftables table %q: %w", masq.TableName, err)
	}
	return true, nil
}
