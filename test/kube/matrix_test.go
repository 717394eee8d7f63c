package kubee2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// echoReply is what kube-echo answers: the source address it saw.
type echoReply struct {
	Client string `json:"client"`
	Pod    string `json:"pod"`
}

// probeTimeout bounds one probe.
var probeTimeout = testenv.Deadline(3 * time.Second)

// httpProbe sends GET / to dst from namespace ns and returns kube-echo's
// reply.
func httpProbe(ns netns.NsHandle, dst netip.AddrPort) (echoReply, error) {
	var r echoReply
	conn, err := lab.DialTCP(ns, dst, probeTimeout)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
		return r, err
	}
	data, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		return r, fmt.Errorf("read from %s: %w", dst, err)
	}
	_, body, ok := strings.Cut(string(data), "\r\n\r\n")
	if !ok {
		return r, fmt.Errorf("%s answered %q", dst, data)
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("%s answered %q: %w", dst, body, err)
	}
	return r, nil
}

// source is the address part of a reply's client.
func (r echoReply) source() netip.Addr {
	ap, err := netip.ParseAddrPort(r.Client)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// podNS opens the network namespace of a pod (its sandbox's, found
// through the node's CRI), for probes from the pod.
func (c *cluster) podNS(p podInfo) (netns.NsHandle, error) {
	n := c.node(p.Node)
	rt, conn, err := n.criClient()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
	defer cancel()
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		State:         &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": "default"},
	}})
	if err != nil {
		return 0, err
	}
	if len(list.Items) != 1 {
		return 0, fmt.Errorf("pod %s: %d ready sandboxes on %s", p.Name, len(list.Items), n.Name)
	}
	st, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: list.Items[0].Id, Verbose: true})
	if err != nil {
		return 0, err
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		return 0, fmt.Errorf("pod %s: sandbox info: %w", p.Name, err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			// /var/run is a symbolic link to /run, which would resolve
			// in the test's mount namespace, not the node's.
			path := ns.Path
			if rest, ok := strings.CutPrefix(path, "/var/run/"); ok {
				path = "/run/" + rest
			}
			return netns.GetFromPath(n.sup.Path(path))
		}
	}
	return 0, fmt.Errorf("pod %s: no network namespace in its sandbox's spec", p.Name)
}

// matrix is the network test matrix of issue 30.
type matrix struct {
	c    *cluster
	pods map[string]podInfo
}

func newMatrix(c *cluster) *matrix { return &matrix{c: c} }

// echoPod is a kube-echo pod on node, labelled app=name plus labels.
func echoPod(name, node string, labels map[string]string, hostPort int) string {
	var l strings.Builder
	fmt.Fprintf(&l, "app: %s", name)
	for k, v := range labels {
		fmt.Fprintf(&l, ", %s: %q", k, v)
	}
	ports := "[{containerPort: 8080, name: http}]"
	if hostPort != 0 {
		ports = fmt.Sprintf("[{containerPort: 8080, name: http, hostPort: %d}]", hostPort)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {%s}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: %s
    imagePullPolicy: Never
    args: [serve]
    ports: %s
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, name, l.String(), node, echoImage, ports)
}

func (m *matrix) setup() {
	c := m.c
	t := c.t
	var docs []string
	for _, n := range c.nodes {
		docs = append(docs, echoPod("a-"+n.Name, n.Name, nil, 0), echoPod("b-"+n.Name, n.Name, nil, 0))
	}
	if out, err := c.kubectl(context.Background(), []byte(strings.Join(docs, "---\n")), "apply", "-f", "-"); err != nil {
		t.Fatalf("create the echo pods: %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "the echo pods to be Ready", func() error {
		pods, err := c.pods("default")
		if err != nil {
			return err
		}
		for _, n := range c.nodes {
			for _, name := range []string{"a-" + n.Name, "b-" + n.Name} {
				p, ok := pods[name]
				if !ok || !p.Ready || !p.IP.IsValid() {
					return fmt.Errorf("pod %s: %+v", name, p)
				}
			}
		}
		m.pods = pods
		return nil
	})
	for _, p := range m.pods {
		t.Logf("pod %s on %s: %s", p.Name, p.Node, p.IP)
	}
}

func (m *matrix) run(t *testing.T) {
	c := m.c
	for _, from := range c.nodes {
		client := m.pods["a-"+from.Name]
		ns, err := c.podNS(client)
		if err != nil {
			t.Fatal(err)
		}
		for _, to := range c.nodes {
			server := m.pods["b-"+to.Name]
			r, err := httpProbe(ns, netip.AddrPortFrom(server.IP, 8080))
			if err != nil {
				t.Errorf("%s -> %s: %v", client.Name, server.Name, err)
				continue
			}
			if r.source() != client.IP {
				t.Errorf("%s -> %s: source %s, want %s", client.Name, server.Name, r.source(), client.IP)
			}
		}
		ns.Close()
	}

}
