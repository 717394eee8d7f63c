package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/printer"
)

// teardown prints only what it removed.
func TestPrintTeardownReportsOnlyRemovals(t *testing.T) {
	for _, tc := range []struct {
		res  daemon.TeardownResult
		want string
	}{
		{daemon.TeardownResult{Device: "overlay.1", Removed: []daemon.RemovedDevice{{Name: "overlay.1"}}, MasqRemoved: true, LeaseRemoved: "10.244.7.0/24", SubnetFile: "/run/overlay/subnet.env"},
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

// teardown honours -w json and -w simple, with the same facts as its
// sentences (it printed them whatever -w said).
func TestTeardownOutputFormats(t *testing.T) {
	res := daemon.TeardownResult{Device: "overlay.1", Removed: []daemon.RemovedDevice{{Name: "overlay.1"}}, MasqRemoved: true, LeaseRemoved: "10.244.7.0/24",
		SubnetFile: "/run/overlay/subnet.env", Warnings: []string{"routes of DirectRouting"}}
	var out bytes.Buffer
	if err := printer.Write(&out, printer.JSON, teardownOutput(res)); err != nil {
		t.Fatal(err)
	}
	var rep teardownReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	want := teardownReport{Removed: []string{"overlay.1", "nftables table inet overlay", "/run/overlay/subnet.env"},
		LeaseReleased: "10.244.7.0/24", LeftInPlace: []string{"routes of DirectRouting"}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("teardown -w json (-want +got):\n%s", diff)
	}
	out.Reset()
	if err := printer.Write(&out, printer.Simple, teardownOutput(res)); err != nil {
		t.Fatal(err)
	}
	wantSimple := "removed overlay.1\nremoved \"nftables table inet overlay\"\nremoved /run/overlay/subnet.env\nreleased 10.244.7.0/24\nleft \"routes of DirectRouting\"\n"
	if out.String() != wantSimple {
		t.Errorf("teardown -w simple:\n%s\nwant\n%s", out.String(), wantSimple)
	}
}
