package kubee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/doctor"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// doctor runs `overlayd doctor -w json` for every node, in its network
// namespace, after the pass's matrix: on a working Kubernetes node it
// finds kube-proxy (by its chains, in iptables and in nftables mode) and
// reports no problem — bridge netfilter on, the FORWARD drop of the
// drop+accept pass accepted, every entry in place. The test reads the
// node's files through /proc/<supervisor>/root, so the conflist's
// subnetFile (/run/overlay/subnet.env, the node's path) cannot equal the
// --subnet-file given here: that one cni-config finding is expected and
// checked for exactly. In kube mode the doctor reads the Nodes (as a user
// holding only overlay-kube.yaml's ClusterRole) instead of etcd, and runs
// once more where a user runs it, in k1's overlayd container, with no
// finding expected.
func (c *cluster) doctor(t *testing.T) {
	t.Helper()
	source := c.doctorSource()
	for _, n := range c.nodes {
		subnetFile := n.sup.Path("/run/overlay/subnet.env")
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
		out, err := c.runIn(ctx, n.NS, nil, filepath.Join(c.root, "bin", "overlayd"), append([]string{"-w", "json",
			"doctor", "--node-name=" + n.Name, "--public-ip=" + n.IP.String(), "--subnet-file=" + subnetFile,
			"--cni-conf-dir=" + n.sup.Path("/etc/cni/net.d")}, source...)...)
		cancel()
		judgeDoctor(t, n.Name+": overlayd doctor", out, err, subnetFile)
	}
	if c.netConf != "" {
		c.doctorInPod(t, "k1")
	}
}

// judgeDoctor checks the JSON report of `overlayd doctor -w json` (out,
// err): kube-proxy found and no problem, but the cni-config one the lab's
// reading of subnetFile through /proc/<pid>/root causes ("" when the
// doctor reads the node's own paths).
func judgeDoctor(t *testing.T, who, out string, err error, subnetFile string) {
	t.Helper()
	var rep struct {
		Clean    bool             `json:"clean"`
		Findings []doctor.Finding `json:"findings"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Errorf("%s: %v (%v): %q", who, jerr, err, out)
		return
	}
	kubeProxy, lines := false, map[doctor.Status]int{}
	for _, f := range rep.Findings {
		lines[f.Status]++
		switch {
		case f.Check == "bridge-netfilter" && f.Status == doctor.OK:
			kubeProxy = true
		case f.Status != doctor.Problem:
		case subnetFile != "" && f.Check == "cni-config" && strings.Contains(f.Message, "has overlay-cni read /run/overlay/subnet.env, but overlayd writes "+subnetFile):
		default:
			t.Errorf("%s: %s: %s; fix: %s", who, f.Check, f.Message, f.Fix)
		}
	}
	expected := ""
	if subnetFile != "" {
		expected = " (the lab's cni-config path one expected)"
	}
	t.Logf("%s: %d ok, %d notes, %d problems%s", who, lines[doctor.OK], lines[doctor.Note], lines[doctor.Problem], expected)
	if !kubeProxy {
		t.Errorf("%s: the doctor did not find kube-proxy, or judged bridge netfilter off: %+v", who, rep.Findings)
	}
}

// doctorInPod runs the doctor as Documentation/kubernetes.md tells a user
// to in kube mode: `kubectl exec` in the overlayd container of node's
// DaemonSet pod, with the container's environment, its service account
// and mounts; every check must pass there.
func (c *cluster) doctorInPod(t *testing.T, node string) {
	t.Helper()
	var pl struct {
		Items []podJSON `json:"items"`
	}
	if err := c.kubeGet(&pl, "-n", "overlay-system", "pods", "-l", "app=overlayd", "--field-selector", "spec.nodeName="+node); err != nil || len(pl.Items) != 1 {
		t.Fatalf("the overlayd pod on %s: %v (%d pods)", node, err, len(pl.Items))
	}
	pod := pl.Items[0].Metadata.Name
	out, err := c.kubectl(context.Background(), nil, "exec", "-n", "overlay-system", pod, "-c", "overlayd", "--",
		"/usr/local/bin/overlayd", "-w", "json", "doctor", "--kube-subnet-mgr", "--net-config-path", "/etc/kube-overlay/net-conf.json")
	judgeDoctor(t, node+": kubectl exec "+pod+" -- overlayd doctor", out, err, "")
}

// doctorUser is who the doctor reads the Nodes as in kube mode: a user
// bound to overlay-kube.yaml's ClusterRole and nothing else.
const doctorUser = "overlay-doctor"

// doctorSource are the doctor's flags saying where the leases are: the
// overlay's etcd; in kube mode the API server, as doctorUser, and the
// network config the manifest's ConfigMap holds.
func (c *cluster) doctorSource() []string {
	if c.netConf == "" {
		return []string{fmt.Sprintf("--endpoints=https://%s:%d", c.cp.IP, overlayEtcd), "--cacert=" + c.etcdCA}
	}
	conf := filepath.Join(c.dir, "net-conf.json")
	if err := os.WriteFile(conf, []byte(c.netConf), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if out, err := c.kubectl(context.Background(), nil, "create", "clusterrolebinding", doctorUser,
		"--clusterrole=overlay", "--user="+doctorUser); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		c.t.Fatalf("bind the doctor's user to the ClusterRole overlay: %v\n%s", err, out)
	}
	return []string{"--kube-subnet-mgr", "--kubeconfig-file=" + c.kubeconfig(doctorUser), "--net-config-path=" + conf}
}
