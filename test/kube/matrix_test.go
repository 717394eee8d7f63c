package kubee2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
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
	Data   string `json:"data"` // a datagram's payload, sent back
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

// udpProbe sends one datagram to dst from namespace ns and returns
// kube-echo's answer, which must carry the datagram's payload back and
// come from dst (the address the client sent to: an answer from
// elsewhere, say a backend's own address that the Service's NAT failed
// to undo, is what a connected UDP socket drops).
func udpProbe(ns netns.NsHandle, dst netip.AddrPort) (echoReply, error) {
	var r echoReply
	unspec := netip.IPv4Unspecified()
	if dst.Addr().Is6() {
		unspec = netip.IPv6Unspecified()
	}
	conn, err := lab.ListenUDP(ns, netip.AddrPortFrom(unspec, 0))
	if err != nil {
		return r, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	payload := rand.Text()
	if _, err := conn.WriteToUDPAddrPort([]byte(payload), dst); err != nil {
		return r, fmt.Errorf("send to udp %s: %w", dst, err)
	}
	buf := make([]byte, 2048)
	n, from, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return r, fmt.Errorf("no answer from udp %s: %w", dst, err)
	}
	if from.Addr().Unmap() != dst.Addr() || from.Port() != dst.Port() {
		return r, fmt.Errorf("udp %s: the answer came from %s", dst, from)
	}
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return r, fmt.Errorf("udp %s answered %q: %w", dst, buf[:n], err)
	}
	if r.Data != payload {
		return r, fmt.Errorf("udp %s answered %q to %q", dst, r.Data, payload)
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
