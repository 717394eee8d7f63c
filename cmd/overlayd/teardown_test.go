package main

import (
	"bytes"
	"testing"

	"github.com/overlaynet/overlay/internal/daemon"
)

// teardown prints only what it removed.
func TestPrintTeardownReportsOnlyRemovals(t *testing.T) {
	for _, tc := range []struct {
		res  daemon.TeardownResult
		want string
	}{
		{daemon.TeardownResult{Device: "overlay.1", DeviceRemoved: true, MasqRemoved: true, LeaseRemoved: "10.244.7.0/24", SubnetFile: "/run/overlay/subnet.env"},
			"removed device overlay.1 and its routes, neighbours and FDB entries\nremoved nftables table inet overlay\nreleased lease 10.244.7.0/24\nremoved /run/overlay/subnet.env\n"},
		{daemon.TeardownResult{Device: "overlay.1", LeaseKept: "no lease names this host"},
			"nothing to remove on this host: no device overlay.1, no nftables table, no subnet file\nlease kept: no lease names this host\n"},
		{daemon.TeardownResult{Device: "overlay.1", SubnetFile: "/run/overlay/subnet.env"}, // etcd down, no device
			"removed /run/overlay/subnet.env\n"},
		{daemon.TeardownResult{}, ""}, // refused before looking
	} {
		var out bytes.Buffer
		printTeardown(&out, tc.res)
		if out.String() != tc.want {
			t.Errorf("printTeardown(%+v) =\n%s\nwant\n%s", tc.res, out.String(), tc.want)
		}
	}
}
