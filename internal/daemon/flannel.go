package daemon

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/overlaynet/overlay/backend"
)

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
		d.log.Info("--adopt-flannel: taking over flanneld's device and its MAC", "device", name, "vtep_mac", mac.String())
	}
	return nil
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
