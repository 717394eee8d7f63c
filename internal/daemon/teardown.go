package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/masq"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TeardownResult says what Teardown removed.
type TeardownResult struct {
	Device       string
	LeaseRemoved string // the subnet whose lease key was deleted, if any
	LeaseKept    string // why the lease was not deleted, if it was not
}

// Teardown removes this host's data path (routes, neighbours, FDB entries,
// the VXLAN device), its lease in etcd (a reservation is kept: an operator
// made it) and subnet.env. Run it after stopping `overlayd run`. The data
// path is removed even when etcd cannot be reached; vni is used then.
func Teardown(ctx context.Context, cfg Config, vni int) (TeardownResult, error) {
	cfg.defaults()
	var res TeardownResult
	nodeID, err := NodeID(cfg.NodeName, cfg.MachineIDFile)
	if err != nil {
		return res, err
	}
	h, err := netlinkHandle(cfg.NetNS)
	if err != nil {
		return res, err
	}
	defer h.Close()
	ul, err := DetectUnderlay(h, cfg.Iface, cfg.PublicIP)
	if err != nil {
		return res, fmt.Errorf("%w (teardown needs the underlay to find direct routes)", err)
	}

	var reg *etcdv3.Registry
	var netCfg *subnet.Config
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := etcdclient.Connect(cctx, cfg.Etcd)
	if err == nil {
		defer cli.Close()
		reg = etcdv3.NewRegistry(cli, cfg.Prefix)
		netCfg, _, err = reg.GetConfig(cctx)
	}
	if err != nil {
		cfg.Logger.Warn("etcd unusable: removing the data path only, the lease stays until its TTL runs out", "err", err, "vni", vni)
		reg = nil
	} else {
		vni = netCfg.Backend.VNI
	}

	nl, err := vxlan.OpenNetlink(cfg.NetNS)
	if err != nil {
		return res, err
	}
	defer nl.Close()
	be, err := vxlan.New(vxlan.Config{VNI: vni, Underlay: ul.Iface, LocalIP: ul.PublicIP, NodeID: nodeID, Logger: cfg.Logger}, nl)
	if err != nil {
		return res, err
	}
	if err := be.Teardown(ctx); err != nil {
		return res, fmt.Errorf("remove the data path: %w", err)
	}
	res.Device = vxlan.DeviceName(vni)
	if err := removeMasq(cfg); err != nil {
		return res, err
	}

	if reg != nil {
		if err := releaseLease(ctx, reg, netCfg, nodeID, ul, &res); err != nil {
			return res, err
		}
	}
	if err := os.Remove(cfg.SubnetFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("remove %s: %w", cfg.SubnetFile, err)
	}
	return res, nil
}

// releaseLease deletes the lease key that names this host, unless it is a
// reservation, and revokes its etcd lease.
func releaseLease(ctx context.Context, reg *etcdv3.Registry, netCfg *subnet.Config, nodeID string, ul Underlay, res *TeardownResult) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := reg.List(ctx)
	if err != nil {
		return fmt.Errorf("find this host's lease: %w", err)
	}
	for _, l := range snap.Leases {
		if !netCfg.Contains(l.Subnet) || !l.Attrs.OwnedBy(nodeID, ul.PublicIP) {
			continue
		}
		if l.Reserved {
			res.LeaseKept = fmt.Sprintf("%s is a reservation (remove it with `overlayd lease revoke %s`)", l.Subnet, l.Subnet)
			return nil
		}
		ok, err := reg.DeleteIfOwned(ctx, l.Subnet, l.ModRevision)
		if err != nil {
			return err
		}
		if ok {
			res.LeaseRemoved = l.Subnet.String()
			// The key is gone either way; an etcd lease left behind just expires.
			_, _ = reg.Client().Revoke(ctx, clientv3.LeaseID(l.EtcdLease))
		} else {
			res.LeaseKept = fmt.Sprintf("%s changed while tearing down (another host took it?)", l.Subnet)
		}
		return nil
	}
	res.LeaseKept = "no lease names this host"
	return nil
}

// removeMasq deletes overlayd's nftables table, if any.
func removeMasq(cfg Config) error {
	var opts []masq.Option
	if cfg.NetNS.IsOpen() {
		opts = append(opts, masq.WithNetNS(cfg.NetNS))
	}
	// The network is irrelevant to removal; any valid prefix will do.
	mq, err := masq.New(netip.MustParsePrefix("10.0.0.0/8"), opts...)
	if err != nil {
		return err
	}
	defer mq.Close()
	if err := mq.Remove(); err != nil {
		return fmt.Errorf("remove the nftables table %q: %w", masq.TableName, err)
	}
	return nil
}
