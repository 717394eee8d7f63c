package vxlan

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"syscall"
)

// deviceDiff is how an existing device differs from the one we want.
type deviceDiff struct {
	// Recreate, if not empty, says why the device must be deleted and
	// created again: the kernel cannot change these attributes in place.
	Recreate string
	// In-place fixes.
	SetMTU  bool
	SetMAC  bool
	SetUp   bool
	AddAddr bool
	DelAddr []netip.Prefix // addresses of the device's family that are not ours
}

// Reason describes the diff for a log line, "" when the device matches.
func (d deviceDiff) Reason() string {
	if d.Recreate != "" {
		return d.Recreate
	}
	var r []string
	if d.SetMTU {
		r = append(r, "wrong MTU")
	}
	if d.SetMAC {
		r = append(r, "wrong MAC")
	}
	if d.AddAddr {
		r = append(r, "address missing")
	}
	if len(d.DelAddr) > 0 {
		r = append(r, fmt.Sprintf("foreign addresses %v", d.DelAddr))
	}
	if d.SetUp {
		r = append(r, "down")
	}
	return strings.Join(r, ", ")
}

// compareDevice compares the device we have (and its addresses of our
// family) with the one we want. Identity attributes (kind, VNI, port, local
// address, underlay, learning, external mode, default remote) force a
// recreation; MTU, MAC, addresses and the up flag are fixed in place. The
// IPv6 link-local addresses the kernel gives every device are its own:
// deleted, they would only come back.
func compareDevice(want, have Link, wantAddr netip.Prefix, haveAddrs []netip.Prefix) deviceDiff {
	var d deviceDiff
	var why []string
	mismatch := func(what string, have, want any) {
		why = append(why, fmt.Sprintf("%s is %v, want %v", what, have, want))
	}
	if have.Kind != "vxlan" {
		mismatch("kind", have.Kind, "vxlan")
	} else {
		if have.VNI != want.VNI {
			mismatch("VNI", have.VNI, want.VNI)
		}
		if have.Port != want.Port {
			mismatch("port", have.Port, want.Port)
		}
		if have.Local != want.Local {
			mismatch("local address", have.Local, want.Local)
		}
		if have.UnderlayIndex != want.UnderlayIndex {
			mismatch("underlay link index", have.UnderlayIndex, want.UnderlayIndex)
		}
		if have.Learning != want.Learning {
			mismatch("learning", have.Learning, want.Learning)
		}
		if have.External {
			mismatch("external (collect metadata) mode", true, false)
		}
		if have.Group.IsValid() {
			mismatch("default remote/group", have.Group, "none")
		}
	}
	if len(why) > 0 {
		d.Recreate = strings.Join(why, "; ")
		return d
	}
	d.SetMTU = have.MTU != want.MTU
	d.SetMAC = have.MAC != want.MAC
	d.SetUp = !have.Up
	d.AddAddr = true
	for _, a := range haveAddrs {
		if a.Addr().Is6() && a.Addr().IsLinkLocalUnicast() {
			continue
		}
		if a == wantAddr {
			d.AddAddr = false
		} else {
			d.DelAddr = append(d.DelAddr, a)
		}
	}
	return d
}

// device keeps the VXLAN device itself right: it creates it, adopts an
// existing one, fixes what can be fixed in place and recreates it when its
// identity differs. It belongs to the reconciler (and so to whoever holds
// Backend.opMu).
type device struct {
	cfg   Config
	nl    Netlink
	log   *slog.Logger
	name  string
	mac   MAC
	seen  bool      // we have seen our device since we started
	stats *counters // the backend's, which the device's writes count in
}

// counters are the backend's write and pass statistics.
type counters struct {
	Passes, Errors, Writes, okWrites, DriftRepairs, DeviceRecreations uint64
}

// write runs one kernel write, counting it.
func (c *counters) write(f func() error) error {
	c.Writes++
	err := f()
	if err == nil {
		c.okWrites++
	}
	return err
}

// spec is the device Config describes on the given underlay.
func (d *device) spec(underlay Link) Link {
	mtu := d.cfg.MTU
	if mtu == 0 {
		mtu = underlay.MTU - famOverhead(d.cfg.fam)
	}
	return Link{
		Name:          d.name,
		Kind:          "vxlan",
		MTU:           mtu,
		MAC:           d.mac,
		Up:            true,
		VNI:           d.cfg.VNI,
		Port:          d.cfg.Port,
		Local:         d.cfg.LocalIP,
		UnderlayIndex: underlay.Index,
	}
}

func (d *device) lookupUnderlay() (Link, error) {
	var l Link
	var err error
	if d.cfg.Underlay != "" {
		l, err = d.nl.LinkByName(d.cfg.Underlay)
	} else {
		l, err = d.nl.LinkByIndex(d.cfg.UnderlayIndex)
	}
	if err != nil {
		return Link{}, fmt.Errorf("underlay link %s: %w (check --iface)", d.underlayName(), err)
	}
	return l, nil
}

func (d *device) underlayName() string {
	if d.cfg.Underlay != "" {
		return d.cfg.Underlay
	}
	return fmt.Sprintf("index %d", d.cfg.UnderlayIndex)
}

// ensure makes the device exist and match, touching nothing when it
// already does. It returns the device, the underlay, and whether the device
// was (re)created, which empties every table on it.
func (d *device) ensure() (dev, underlay Link, created bool, err error) {
	if err := d.cfg.checkDevice(); err != nil {
		return Link{}, Link{}, false, err
	}
	underlay, err = d.lookupUnderlay()
	if err != nil {
		return Link{}, Link{}, false, err
	}
	want := d.spec(underlay)
	// Our subnet's network address as a host address (/32, /128), as
	// flannel does.
	wantAddr := netip.PrefixFrom(d.cfg.OwnSubnet.Addr(), d.cfg.OwnSubnet.Addr().BitLen())

	have, err := d.nl.LinkByName(d.name)
	switch {
	case errors.Is(err, ErrLinkNotFound):
		if d.seen {
			d.log.Warn("overlay device disappeared, recreating it and replaying all peers")
			d.stats.DeviceRecreations++
		}
		dev, err = d.create(want, wantAddr)
		return dev, underlay, err == nil, err
	case err != nil:
		return Link{}, underlay, false, fmt.Errorf("look up device %s: %w", d.name, err)
	}

	addrs, err := retryDump(func() ([]netip.Prefix, error) { return d.nl.AddrListFamily(have.Index, d.cfg.fam) })
	if err != nil {
		return Link{}, underlay, false, fmt.Errorf("list addresses of %s: %w", d.name, err)
	}
	delta := compareDevice(want, have, wantAddr, addrs)
	if delta.Recreate != "" {
		d.log.Warn("overlay device does not match the configuration, recreating it", "reason", delta.Recreate)
		if err := d.stats.write(func() error { return d.nl.LinkDel(have.Index) }); err != nil && !isNotFound(err) {
			return Link{}, underlay, false, fmt.Errorf("delete mismatched device %s (%s): %w", d.name, delta.Recreate, err)
		}
		d.stats.DeviceRecreations++
		dev, err = d.create(want, wantAddr)
		return dev, underlay, err == nil, err
	}
	if r := delta.Reason(); r != "" {
		d.log.Info("fixing overlay device in place", "reason", r)
	}
	if err := d.fix(have.Index, want, wantAddr, delta); err != nil {
		return Link{}, underlay, false, err
	}
	d.seen = true
	have.MTU, have.MAC, have.Up = want.MTU, want.MAC, true
	return have, underlay, false, nil
}

// fix applies the in-place part of a deviceDiff. The address goes on
// before the link comes up, as at creation.
func (d *device) fix(index int, want Link, wantAddr netip.Prefix, delta deviceDiff) error {
	if delta.SetMTU {
		if err := d.stats.write(func() error { return d.nl.LinkSetMTU(index, want.MTU) }); err != nil {
			return fmt.Errorf("set MTU %d on %s: %w", want.MTU, d.name, err)
		}
	}
	if delta.SetMAC {
		if err := d.stats.write(func() error { return d.nl.LinkSetMAC(index, want.MAC) }); err != nil {
			return fmt.Errorf("set MAC %s on %s: %w", want.MAC, d.name, err)
		}
	}
	for _, a := range delta.DelAddr {
		if err := d.stats.write(func() error { return d.nl.AddrDel(index, a) }); err != nil && !isNotFound(err) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("remove foreign address %s from %s: %w", a, d.name, err)
		}
	}
	if delta.AddAddr {
		if err := d.stats.write(func() error { return d.nl.AddrReplace(index, wantAddr) }); err != nil {
			return fmt.Errorf("add address %s to %s: %w", wantAddr, d.name, err)
		}
	}
	if delta.SetUp {
		if err := d.stats.write(func() error { return d.nl.LinkSetUp(index) }); err != nil {
			return fmt.Errorf("set %s up: %w", d.name, err)
		}
	}
	return nil
}

// create creates the device with its MAC and MTU set at creation,
// then adds the address and sets it up. A half-made device left by a failure
// is finished (or found mismatched) by the next pass.
func (d *device) create(want Link, wantAddr netip.Prefix) (Link, error) {
	if err := d.stats.write(func() error { return d.nl.LinkAdd(want) }); err != nil {
		return Link{}, d.explainLinkAdd(want, err)
	}
	d.seen = true
	dev, err := d.nl.LinkByName(want.Name)
	if err != nil {
		return Link{}, fmt.Errorf("look up %s after creating it: %w", want.Name, err)
	}
	d.log.Info("created overlay device", "vni", want.VNI, "port", want.Port,
		"local", want.Local, "mtu", want.MTU, "mac", want.MAC.String())
	if err := d.fix(dev.Index, want, wantAddr, deviceDiff{AddAddr: true, SetUp: !dev.Up}); err != nil {
		return Link{}, err
	}
	dev.Up = true
	return dev, nil
}

// explainLinkAdd turns the kernel's terse refusal into what to do about it.
func (d *device) explainLinkAdd(want Link, err error) error {
	if errors.Is(err, syscall.EEXIST) {
		// The name is free (we looked), so another VXLAN device of our
		// family holds the same VNI and port, typically flannel.1 (the
		// other family's device, our twin, may: the kernel keeps them
		// apart).
		if links, lerr := d.nl.LinkList(); lerr == nil {
			for _, l := range links {
				if l.Kind == "vxlan" && l.VNI == want.VNI && l.Port == want.Port && l.Name != want.Name && l.Family() == want.Family() {
					hint := "delete it or choose another VNI/port"
					if strings.HasPrefix(l.Name, "flannel") {
						hint = "to take over flanneld's device, its routes and masquerade in place, run overlayd with --adopt-flannel (Documentation/migrating-from-flannel.md); else " + hint
					}
					return fmt.Errorf("create %s: device %s already uses VNI %d on port %d; %s: %w",
						want.Name, l.Name, want.VNI, want.Port, hint, err)
				}
			}
		}
	}
	return fmt.Errorf("create VXLAN device %s (VNI %d, port %d, local %s, underlay index %d, MTU %d): %w",
		want.Name, want.VNI, want.Port, want.Local, want.UnderlayIndex, want.MTU, err)
}
