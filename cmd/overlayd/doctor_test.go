package main

import (
	"os"
	"path/filepath"
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

// In kube mode the doctor reads the network config file and the Nodes,
// never etcd: a missing file is named with where to mount it, and an API
// server it cannot reach with the request that failed; both exit 1
// before any finding.
func TestDoctorInKubeModeSaysWhatItCouldNotRead(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "net-conf.json")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(conf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1 of the loopback.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	host := []string{"doctor", "--kube-subnet-mgr", "--node-name", "n1", "--iface", testIface(t), "--subnet-file", filepath.Join(dir, "subnet.env"), "--kubeconfig-file", kubeconfig}
	for _, tc := range []struct {
		name, conf string
		want       []string
	}{
		{"no network config", filepath.Join(dir, "missing.json"), []string{"--net-config-path", "missing.json", "mount the ConfigMap's net-conf.json there"}},
		{"API server unreachable", conf, []string{"list the Nodes", "127.0.0.1:1", "check that the API server answers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", "", append(host, "--net-config-path", tc.conf)...)
			if r.code != exitError || r.out != "" {
				t.Errorf("exit %d, stdout %q; want exit 1 and no findings (stderr %q)", r.code, r.out, r.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.err, w) {
					t.Errorf("stderr %q does not name %q", r.err, w)
				}
			}
		})
	}
}
