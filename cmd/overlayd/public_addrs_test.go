package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// The shipped DaemonSet passes Kubernetes' status.hostIP as
// OVERLAY_PUBLIC_IP: the node's IPv6 address on an IPv6-only cluster.
// run takes it as --public-ipv6 rather than failing, and refuses two
// different IPv6 addresses.
func TestPublicIPv6AddressIsTakenAsPublicIPv6(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name         string
		ip, ip6      string
		want4, want6 string
		err          string
	}{
		{name: "IPv4", ip: "198.18.0.7", want4: "198.18.0.7"},
		{name: "IPv4 and IPv6", ip: "198.18.0.7", ip6: "fd18::7", want4: "198.18.0.7", want6: "fd18::7"},
		{name: "IPv6 alone", ip: "fd18::7", want6: "fd18::7"},
		{name: "IPv6 twice, the same", ip: "fd18::7", ip6: "fd18::7", want6: "fd18::7"},
		{name: "IPv6 twice, different", ip: "fd18::7", ip6: "fd18::8", err: "--public-ip fd18::7 is an IPv6 address, taken as --public-ipv6, but --public-ipv6 is fd18::8"},
		{name: "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hostFlags
			if tc.ip != "" {
				h.publicIP = a(tc.ip)
			}
			if tc.ip6 != "" {
				h.publicIPv6 = a(tc.ip6)
			}
			v4, v6, err := h.publicAddrs(pflag.NewFlagSet("run", pflag.ContinueOnError))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := addrString(v4); got != tc.want4 {
				t.Errorf("IPv4 %q, want %q", got, tc.want4)
			}
			if got := addrString(v6); got != tc.want6 {
				t.Errorf("IPv6 %q, want %q", got, tc.want6)
			}
		})
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
