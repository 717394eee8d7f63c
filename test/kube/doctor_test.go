package kubee2e

import (
	"context"
	"encoding/json"
	"fmt"
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
// checked for exactly.
func (c *cluster) doctor(t *testing.T) {
	t.Helper()
	for _, n := range c.nodes {
		subnetFile := n.sup.Path("/run/overlay/subnet.env")
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
		out, err := c.runIn(ctx, n.NS, nil, filepath.Join(c.root, "bin", "overlayd"),
			fmt.Sprintf("--endpoints=https://%s:%d", c.cp.IP, overlayEtcd), "--cacert="+c.etcdCA, "-w", "json",
			"doctor", "--node-name="+n.Name, "--public-ip="+n.IP.String(), "--subnet-file="+subnetFile,
			"--cni-conf-dir="+n.sup.Path("/etc/cni/net.d"))
		cancel()
		var rep struct {
			Clean    bool             `json:"clean"`
			Findings []doctor.Finding `json:"findings"`
		}
		if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
			t.Errorf("%s: overlayd doctor: %v (%v): %q", n.Name, jerr, err, out)
			continue
		}
		kubeProxy, lines := false, map[doctor.Status]int{}
		for _, f := range rep.Findings {
			lines[f.Status]++
			switch {
			case f.Check == "bridge-netfilter" && f.Status == doctor.OK:
				kubeProxy = true
			case f.Status != doctor.Problem:
			case f.Check == "cni-config" && strings.Contains(f.Message, "has overlay-cni read /run/overlay/subnet.env, but overlayd writes "+subnetFile):
			default:
				t.Errorf("%s: doctor: %s: %s; fix: %s", n.Name, f.Check, f.Message, f.Fix)
			}
		}
		t.Logf("%s: overlayd doctor: %d ok, %d notes, %d problems (the lab's cni-config path one expected)", n.Name, lines[doctor.OK], lines[doctor.Note], lines[doctor.Problem])
		if !kubeProxy {
			t.Errorf("%s: the doctor did not find kube-proxy, or judged bridge netfilter off: %+v", n.Name, rep.Findings)
		}
	}
}
