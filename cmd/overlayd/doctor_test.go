package main

import (
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/doctor"
)

// Without a network config in etcd there is nothing to check the host
// against: the doctor says so, naming the command that stores one, and
// exits 1 before it gathers any fact of the host.
func TestDoctorWithoutANetworkConfigSaysWhatToDo(t *testing.T) {
	srv, _ := cluster(t)
	r := run(t, srv.Endpoint, "", "doctor", "--iface", testIface(t), "--subnet-file", t.TempDir()+"/subnet.env")
	if r.code != exitError || !strings.Contains(r.err, "no network config") || !strings.Contains(r.err, "overlayd config put -f FILE") {
		t.Errorf("doctor without a config: exit %d, stderr %q; want exit 1 naming the missing config and `overlayd config put`", r.code, r.err)
	}
	if r.out != "" {
		t.Errorf("doctor printed findings without a config: %q", r.out)
	}
}

// One row per finding: the status, the check, and the message with its
// fix; -w json is the report with "clean".
func TestDoctorOutputRows(t *testing.T) {
	fs := []doctor.Finding{
		{Check: "forwarding", Status: doctor.OK, Message: "fine"},
		{Check: "mtu", Status: doctor.Problem, Subject: "veth1", Message: "too big", Fix: "recreate the pod"},
	}
	out := doctorOutput(fs)
	want := [][]string{{"ok", "forwarding", "fine"}, {"problem", "mtu", "too big; fix: recreate the pod"}}
	if len(out.Rows) != 2 || strings.Join(out.Rows[0], "|") != strings.Join(want[0], "|") || strings.Join(out.Rows[1], "|") != strings.Join(want[1], "|") {
		t.Errorf("rows %q, want %q", out.Rows, want)
	}
	if rep, ok := out.JSON.(doctorReport); !ok || rep.Clean || len(rep.Findings) != 2 {
		t.Errorf("JSON %+v, want an unclean report of both findings", out.JSON)
	}
	if problems(fs) != 1 {
		t.Errorf("problems = %d, want 1", problems(fs))
	}
}
