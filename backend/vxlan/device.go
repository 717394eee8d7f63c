package vxlan

import (
	"errors"
	"fmt"
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
	DelAddr []netip.Prefix // IPv4 addresses that are not ours
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

// compareDevice compares the device we have (and its IPv4 addresses) with
// the one we want. Identity attributes (kind, VNI, port, local address,
// underlay, learning, external mode, default remote) force a recreation;
// MTU, MAC, addresses and the up flag are fixed in place.
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
		if a == wantAddr {
			d.AddAddr = false
		} else {
			d.DelAddr = append(d.DelAddr, a)
		}
	}
	return d
}

// wantDevice is the device Config describes on the given underlay.
func (b *Backend) wantDevice(underlay Link) Link {
	mtu := b.cfg.MTU
	if mtu == 0 {
		mtu = underlay.MTU - Overhead
	}
	return Link{
		Name:          b.name,
		Kind:          "vxlan",
		MTU:           mtu,
		MAC:           b.mac,
		Up:            true,
		VNI:           b.cfg.VNI,
		Port:          b.cfg.Port,
		Local:         b.cfg.LocalIP,
		UnderlayIndex: underlay.Index,
	}
}

func (b *Backend) lookupUnderlay() (Link, error) {
	var l Link
	var err error
	if b.cfg.Underlay != "" {
		l, err = b.nl.LinkByName(b.cfg.Underlay)
	} else {
		l, err = b.nl.LinkByIndex(b.cfg.UnderlayIndex)
	}
	if err != nil {
		return Link{}, fmt.Errorf("underlay link %s: %w (check --iface)", b.underlayName(), err)
	}
	return l, nil
}

func (b *Backend) underlayName() string {
	if b.cfg.Underlay != "" {
		return b.cfg.Underlay
	}
	return fmt.Sprintf("index %d", b.cfg.UnderlayIndex)
}

// ensureDevice makes the device exist and match, touching nothing when it
// already does. It returns the device, the underlay, and whether the device
// was (re)created, which empties every table on it. Callers hold b.opMu.
func (b *Backend) ensureDevice() (dev, underlay Link, created bool, err error) {
	if err := b.cfg.checkDevice(); err != nil {
		return Link{}, Link{}, false, err
	}
	underlay, err = b.lookupUnderlay()
	if err != nil {
		return Link{}, Link{}, false, err
	}
	want := b.wantDevice(underlay)
	wantAddr := netip.PrefixFrom(b.cfg.OwnSubnet.Addr(), 32)

	have, err := b.nl.LinkByName(b.name)
	switch {
	case errors.Is(err, ErrLinkNotFound):
		if b.devSeen {
			b.log.Warn("overlay device disappeared, recreating it and replaying all peers")
			b.stats.DeviceRecreations++
		}
		dev, err = b.createDevice(want, wantAddr)
		return dev, underlay, err == nil, err
	case err != nil:
		return Link{}, underlay, false, fmt.Errorf("look up device %s: %w", b.name, err)
	}

	addrs, err := retryDump(func() ([]netip.Prefix, error) { return b.nl.AddrList(have.Index) })
	if err != nil {
		return Link{}, underlay, false, fmt.Errorf("list addresses of %s: %w", b.name, err)
	}
	d := compareDevice(want, have, wantAddr, addrs)
	if d.Recreate != "" {
		b.log.Warn("overlay device does not match the configuration, recreating it", "reason", d.Recreate)
		if err := b.write(func() error { return b.nl.LinkDel(have.Index) }); err != nil && !isNotFound(err) {
			return Link{}, underlay, false, fmt.Errorf("delete mismatched device %s (%s): %w", b.name, d.Recreate, err)
		}
		b.stats.DeviceRecreations++
		dev, err = b.createDevice(want, wantAddr)
		return dev, underlay, err == nil, err
	}
	if r := d.Reason(); r != "" {
		b.log.Info("fixing overlay device in place", "reason", r)
	}
	if err := b.fixDevice(have.Index, want, wantAddr, d); err != nil {
		return Link{}, underlay, false, err
	}
	b.devSeen = true
	have.MTU, have.MAC, have.Up = want.MTU, want.MAC, true
	return have, underlay, false, nil
}

// fixDevice applies the in-place part of a deviceDiff. The address goes on
// before the link comes up, as at creation.
func (b *Backend) fixDevice(index int, want Link, wantAddr netip.Prefix, d deviceDiff) error {
	if d.SetMTU {
		if err := b.write(func() error { return b.nl.LinkSetMTU(index, want.MTU) }); err != nil {
			return fmt.Errorf("set MTU %d on %s: %w", want.MTU, b.name, err)
		}
	}
	if d.SetMAC {
		if err := b.write(func() error { return b.nl.LinkSetMAC(index, want.MAC) }); err != nil {
			return fmt.Errorf("set MAC %s on %s: %w", want.MAC, b.name, err)
		}
	}
	for _, a := range d.DelAddr {
		if err := b.write(func() error { return b.nl.AddrDel(index, a) }); err != nil && !isNotFound(err) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("remove foreign address %s from %s: %w", a, b.name, err)
		}
	}
	if d.AddAddr {
		if err := b.write(func() error { return b.nl.AddrReplace(index, wantAddr) }); err != nil {
			return fmt.Errorf("add address %s to %s: %w", wantAddr, b.name, err)
		}
	}
	if d.SetUp {
		if err := b.write(func() error { return b.nl.LinkSetUp(index) }); err != nil {
			return fmt.Errorf("set %s up: %w", b.name, err)
		}
	}
	return nil
}

// createDevice creates the device with its MAC and MTU set at creation,
// then adds the address and sets it up. A half-made device left by a failure
// is finished (or found mismatched) by the next pass.
func (b *Backend) createDevice(want Link, wantAddr netip.Prefix) (Link, error) {
	if err := b.write(func() error { return b.nl.LinkAdd(want) }); err != nil {
		return Link{}, b.explainLinkAdd(want, err)
	}
	b.devSeen = true
	dev, err := b.nl.LinkByName(want.Name)
	if err != nil {
		return Link{}, fmt.Errorf("look up %s after creating it: %w", want.Name, err)
	}
	b.log.Info("created overlay device", "vni", want.VNI, "port", want.Port,
		"local", want.Local, "mtu", want.MTU, "mac", want.MAC.String())
	if err := b.fixDevice(dev.Index, want, wantAddr, deviceDiff{AddAddr: true, SetUp: !dev.Up}); err != nil {
		return Link{}, err
	}
	dev.Up = true
	return dev, nil
}

// explainLinkAdd turns the kernel's terse refusal into what to do about it.
func (b *Backend) explainLinkAdd(want Link, err error) error {
	if errors.Is(err, syscall.EEXIST) {
		// The name is free (we looked), so another VXLAN device holds the
		// same VNI and port, typically flannel.1.
		if links, lerr := b.nl.LinkList(); lerr == nil {
			for _, l := range links {
				if l.Kind == "vxlan" && l.VNI == want.VNI && l.Port == want.Port && l.Name != want.Name {
					return fmt.Errorf("create %s: device %s already uses VNI %d on port %d; delete it or choose another VNI/port: %w",
						want.Name, l.Name, want.VNI, want.Port, err)
				}
			}
		}
	}
	return fmt.Errorf("create VXLAN device %s (VNI %d, port %d, local %s, underlay index %d, MTU %d): %w",
		want.Name, want.VNI, want.Port, want.Local, want.UnderlayIndex, want.MTU, err)
}
