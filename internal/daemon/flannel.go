package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/subnet"
)

// FlannelSubnetFile is where flanneld writes its subnet.env by default
// (its --subnet-file), in etcd and in kube mode.
const FlannelSubnetFile = "/run/flannel/subnet.env"

// ErrFlannelSubnet: --adopt-flannel found flanneld serving another subnet
// on this host than the lease overlayd holds (kube mode: the Node's
// podCIDR). Taking its device over would move the device's address and
// leave every pod flanneld's CNI plugin attached with an address no host
// routes here any more.
var ErrFlannelSubnet = errors.New("--adopt-flannel: flanneld served another subnet on this host")

// flannelDevice is a VXLAN device of flanneld's being taken over: its name
// and MAC, which stay, so the other hosts' neighbour and FDB entries for
// this host stay valid through the switch.
type flannelDevice struct {
	name string
	mac  net.HardwareAddr
}

// macOr is the device's MAC, or def if no device is being taken over.
func (f flannelDevice) macOr(def net.HardwareAddr) net.HardwareAddr {
	if f.name == "" {
		return def
	}
	return f.mac
}

// FlannelDeviceNames are flanneld's VXLAN devices for vni, IPv4 and IPv6.
func FlannelDeviceNames(vni int) (v4, v6 string) {
	return "flannel." + strconv.Itoa(vni), "flannel-v6." + strconv.Itoa(vni)
}

// flannelDeviceName is flanneld's VXLAN device of fam for vni.
func flannelDeviceName(fam backend.Family, vni int) string {
	v4, v6 := FlannelDeviceNames(vni)
	if fam == backend.IPv6 {
		return v6
	}
	return v4
}

// findFlannel looks for flanneld's devices of the network's families
// (flannel.<VNI>, flannel-v6.<VNI>) when asked to adopt them.
func (d *daemon) findFlannel() error {
	if !d.cfg.AdoptFlannel {
		return nil
	}
	for _, fp := range d.planes {
		name := flannelDeviceName(fp.family, d.netCfg.Backend.VNI)
		mac, ok, err := d.cfg.Kernel.LinkMAC(name)
		if err != nil {
			return fmt.Errorf("--adopt-flannel: %w", err)
		}
		if !ok {
			d.log.Info("--adopt-flannel: no flanneld device to take over; using overlay's own", "device", name)
			continue
		}
		fp.flannel = flannelDevice{name: name, mac: mac}
		d.log.Info("--adopt-flannel: found flanneld's device; its MAC is this host's VTEP MAC", "device", name, "vtep_mac", mac.String())
	}
	return nil
}

// checkFlannelSubnets makes sure that what flanneld served on this host,
// by the address of each of its devices being taken over and by its
// subnet.env (Config.FlannelSubnetFile, if there is one), is the lease
// just acquired: in etcd mode the lease found by the public IP, in kube
// mode the Node's podCIDR. They differ when flanneld's lease expired and
// was taken, or when the Node was registered again with another podCIDR.
// Nothing is touched before this: a mismatch fails the start.
func (d *daemon) checkFlannelSubnets() error {
	var problems []string
	adopting := false
	for _, fp := range d.planes {
		if fp.flannel.name == "" {
			continue
		}
		adopting = true
		own, nw := ownSubnet(d.lease, fp.family), network(d.netCfg, fp.family)
		addrs, err := d.cfg.Kernel.LinkAddrs(fp.flannel.name)
		if err != nil {
			return fmt.Errorf("--adopt-flannel: %w", err)
		}
		for _, a := range addrs {
			if nw.Contains(a.Addr()) && !own.Contains(a.Addr()) {
				problems = append(problems, fmt.Sprintf("its device %s has address %s", fp.flannel.name, a))
			}
		}
	}
	if !adopting {
		return nil
	}
	env, err := subnet.ReadEnv(d.cfg.FlannelSubnetFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.log.Info("--adopt-flannel: no subnet.env of flanneld's to check against the lease; the device's address is checked", "flannel_subnet_file", d.cfg.FlannelSubnetFile)
	case err != nil:
		d.log.Warn("--adopt-flannel: cannot read flanneld's subnet.env; the device's address is checked", "flannel_subnet_file", d.cfg.FlannelSubnetFile, "err", err)
	default:
		for _, f := range []struct {
			key       string
			got, want netip.Prefix
			on        bool
		}{
			{"SUBNET", env.Subnet, d.lease.Subnet, d.netCfg.EnableIPv4},
			{"IPV6_SUBNET", env.IPv6Subnet, d.lease.IPv6Subnet, d.netCfg.EnableIPv6},
		} {
			if f.on && f.got.IsValid() && f.got.Masked() != f.want {
				problems = append(problems, fmt.Sprintf("%s says %s", d.cfg.FlannelSubnetFile, f.got))
			}
		}
	}
	if len(problems) == 0 {
		for _, fp := range d.planes {
			if fp.flannel.name != "" {
				d.log.Info("--adopt-flannel: taking over flanneld's device and its MAC", "device", fp.flannel.name, "vtep_mac", fp.flannel.mac.String())
			}
		}
		return nil
	}
	return fmt.Errorf("%w: %s, but this host's lease is %s (%s): the pods flanneld attached hold addresses of the subnet it served, which no host would route here any more. "+
		"Give this host that subnet back (kube mode: the Node's podCIDR is fixed when it registers), or drain it, delete flanneld's device (`ip link delete %s`) and the pods' bridge (`ip link delete cni0`: the bridge plugin refuses one with another subnet's address), and start overlayd again",
		ErrFlannelSubnet, strings.Join(problems, "; "), d.lease.Subnets(), d.src.LeaseName(d.lease.Subnets()), d.flannelNames())
}

// flannelNames are the names of flanneld's devices being taken over.
func (d *daemon) flannelNames() string {
	var names []string
	for _, fp := range d.planes {
		if fp.flannel.name != "" {
			names = append(names, fp.flannel.name)
		}
	}
	return strings.Join(names, "`, `ip link delete ")
}

// adoptFlannelRoutes makes the routes flanneld left on its device ours
// before the first pass, so that each is replaced by ours without a gap.
func (d *daemon) adoptFlannelRoutes(ctx context.Context, be backend.Plane, dev flannelDevice) error {
	if dev.name == "" {
		return nil
	}
	if err := d.cfg.Kernel.MarkTakenOver(dev.name); err != nil {
		d.log.Warn("--adopt-flannel: cannot mark flanneld's device as overlayd's; overlayd teardown removes it only while it carries overlayd's routes (else remove it with `ip link delete`)", "device", dev.name, "err", err)
	}
	n, err := be.AdoptRoutes(ctx)
	if err != nil {
		return fmt.Errorf("--adopt-flannel: %w", err)
	}
	d.log.Info("--adopt-flannel: flanneld's routes taken over", "device", dev.name, "routes", n)
	return nil
}

// removeFlannelMasq deletes flanneld's masquerade chain once ours is in
// place: pod traffic to the outside is masqueraded at every moment.
func (d *daemon) removeFlannelMasq(mq Masquerader) {
	if !slices.ContainsFunc(d.planes, func(fp *familyPlane) bool { return fp.flannel.name != "" }) {
		return
	}
	tables, err := mq.RemoveFlannel()
	switch {
	case err != nil:
		d.log.Warn("--adopt-flannel: could not remove flanneld's masquerade chain; both masquerade until it is removed (harmless)", "err", err)
	case len(tables) == 0:
		d.log.Info("--adopt-flannel: no flanneld masquerade chain in nftables; if flanneld used iptables-legacy, remove it with `iptables -t nat -D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG` and `iptables -t nat -F FLANNEL-POSTRTG; iptables -t nat -X FLANNEL-POSTRTG`")
	default:
		d.log.Info("--adopt-flannel: flanneld's masquerade chain removed; overlay's table masquerades", "tables", tables)
	}
}
