package testenv

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// WithoutCapabilities runs fn on a thread switched into network namespace
// ns (if open) that then drops caps from its effective set: what a
// program granted fewer capabilities than root sees, such as a container
// given NET_ADMIN and NET_RAW alone (no CAP_SYS_ADMIN). Capabilities are
// per thread; the thread is never unlocked, so it ends with fn's goroutine
// and no other code ever runs on it.
func WithoutCapabilities(ns netns.NsHandle, caps []uintptr, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if ns.IsOpen() {
			if err := netns.Set(ns); err != nil {
				errc <- fmt.Errorf("enter the network namespace: %w", err)
				return
			}
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capget: %w", err)
			return
		}
		for _, c := range caps {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("drop capabilities %v: %w", caps, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
