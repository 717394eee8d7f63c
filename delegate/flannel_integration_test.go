package delegate_test

// Pods added by flannel's CNI plugin, then deleted (and their addresses
// protected) by overlay-cni after the conflist switched: the real bridge
// and host-local plugins, driven through libcni in the lab's namespaces.

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// flannelNetwork is the name kube-flannel's conflist gives the network,
// kept by the overlay conflist that replaces it (Documentation/cni.md).
const flannelNetwork = "cbr0"

// writeFlannelEnv writes the lab's subnet.env in flanneld's format, as the
// overlay conflist finds it when subnetFile points at flanneld's file (or
// at overlayd's, written with --subnet-file-format flannel).
func (l *lab) writeFlannelEnv(lease string) subnet.Env {
	l.t.Helper()
	env := subnet.NewEnv(netip.MustParsePrefix(testNetwork), netip.MustParsePrefix(lease), testMTU, true)
	if err := subnet.WriteEnvFormat(l.subnetFile, env, subnet.FormatFlannel); err != nil {
		l.t.Fatal(err)
	}
	if data, _ := os.ReadFile(l.subnetFile); !strings.HasPrefix(string(data), "FLANNEL_NETWORK=") {
		l.t.Fatalf("subnet.env is not in flanneld's format: %q", data)
	}
	return env
}

// flannelAdd does what flannel's CNI plugin (v1.x) does on ADD for
// kube-flannel's conflist: render bridge's configuration from flanneld's
// subnet.env (the conflist's delegate keys hairpinMode and
// isDefaultGateway; name, cniVersion 0.3.1, ipMasq = !FLANNEL_IPMASQ, mtu
// = FLANNEL_MTU, isGateway; ipam host-local with the lease as the one range
// and a route to FLANNEL_NETWORK), write it, JSON with keys sorted, to
// <flannelDir>/<containerID>, and run bridge's ADD with it. The ipam
// dataDir keeps host-local's store in the lab (flannel passes a
// conflist's ipam keys through).
func (l *lab) flannelAdd(flannelDir string, env subnet.Env, rt *libcni.RuntimeConf) netip.Addr {
	l.t.Helper()
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "0.3.1", "name": flannelNetwork, "type": "bridge",
		"hairpinMode": true, "isDefaultGateway": true,
		"ipMasq": !env.IPMasq, "mtu": env.MTU, "isGateway": true,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": l.ipamDir,
			"ranges": [][]map[string]string{{{"subnet": env.Lease().String()}}},
			"routes": []map[string]string{{"dst": env.Network.String()}},
		},
	})
	if err != nil {
		l.t.Fatal(err)
	}
	if err := os.MkdirAll(flannelDir, 0o700); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(flannelDir, rt.ContainerID), conf, 0o600); err != nil {
		l.t.Fatal(err)
	}
	netConf, err := libcni.ConfFromBytes(conf)
	if err != nil {
		l.t.Fatal(err)
	}
	var res *types100.Result
	err = l.inHost(func() error {
		r, err := l.cni.AddNetwork(context.Background(), netConf, rt)
		if err == nil {
			res, err = types100.NewResultFromResult(r)
		}
		return err
	})
	if err != nil {
		l.t.Fatalf("flannel-style ADD of %s: %v", rt.ContainerID, err)
	}
	return podAddr(l.t, res)
}

// flannelConflist is the shipped conflist renamed to flannel's network
// name, at 1.1.0, with flannel's cache directory set.
func (l *lab) flannelConflist(flannelDir string) *libcni.NetworkConfigList {
	l.t.Helper()
	list := l.shippedConflist()
	list["name"], list["cniVersion"] = flannelNetwork, "1.1.0"
	delete(list, "cniVersions")
	list["plugins"].([]any)[0].(map[string]any)["flannelDataDir"] = flannelDir
	return l.localize(list, nil)
}

// hostVeths lists the veths enslaved to cni0 in the lab's host namespace.
func (l *lab) hostVeths() []string {
	l.t.Helper()
	var names []string
	err := l.inHost(func() error {
		br, err := netlink.LinkByName("cni0")
		if err != nil {
			return err
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, link := range links {
			if link.Type() == "veth" && link.Attrs().MasterIndex == br.Attrs().Index {
				names = append(names, link.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		l.t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// TestIntegrationPodsFlannelAdded: four pods added by flannel's plugin
// hold four of the five pod addresses of a /29. After the conflist
// switched to overlay-cni (same network name, subnetFile in flanneld's
// format), a new pod gets the fifth address and a second one none — never
// an address an old pod holds. The runtime's DEL of an old pod reaches
// overlay-cni, which replays flannel's cached configuration: the pod's
// address is released, its veth removed, flannel's entry gone; the next
// new pod gets that address. CHECK of an old pod passes.
func TestIntegrationPodsFlannelAdded(t *testing.T) {
	l := newLab(t)
	env := l.writeFlannelEnv("10.244.7.0/29") // .1 gateway, .2-.6 pods
	flannelDir := filepath.Join(t.TempDir(), "flannel")
	old := map[string]netip.Addr{}
	oldRT := map[string]*libcni.RuntimeConf{}
	oldNS := map[string]ns.NetNS{}
	for _, cid := range []string{"old1", "old2", "old3", "old4"} {
		oldNS[cid] = testenv.NewNS(t)
		oldRT[cid] = rtOf(cid, oldNS[cid])
		old[cid] = l.flannelAdd(flannelDir, env, oldRT[cid])
	}
	list := l.flannelConflist(flannelDir)

	newAddr := podAddr(t, l.mustAdd(list, rtOf("new1", testenv.NewNS(t))))
	for cid, a := range old {
		if newAddr == a {
			t.Fatalf("new pod got %s, the address of %s added by flannel's plugin", newAddr, cid)
		}
	}
	if newAddr != netip.MustParseAddr("10.244.7.6") {
		t.Errorf("new pod got %s, want the one free address 10.244.7.6", newAddr)
	}
	if _, err := l.add(list, rtOf("new2", testenv.NewNS(t))); err == nil || !strings.Contains(err.Error(), "no IP addresses available") {
		t.Fatalf("ADD in a full lease = %v, want host-local's no IP addresses available (old pods' addresses are taken)", err)
	}
	if len(l.hostVeths()) != 5 {
		t.Fatalf("host veths %v, want one per pod (5)", l.hostVeths())
	}

	// CHECK of a pod flannel added: flannel's configuration, the lease of
	// subnet.env, bridge's CHECK of the pod as it is.
	if err := l.inHost(func() error { return l.cni.CheckNetworkList(context.Background(), list, oldRT["old1"]) }); err != nil {
		t.Errorf("CHECK of a pod flannel's plugin added: %v", err)
	}

	// The runtime's DEL of an old pod, through the new conflist.
	l.mustDel(list, oldRT["old2"])
	if v := inspectPod(t, oldNS["old2"]); v.exists {
		t.Error("eth0 still in the old pod after DEL")
	}
	if got := len(l.hostVeths()); got != 4 {
		t.Errorf("host veths after DEL: %v, want 4", l.hostVeths())
	}
	if _, ok := l.reservationsOf(flannelNetwork)[old["old2"].String()]; ok {
		t.Errorf("address %s of the deleted pod still reserved", old["old2"])
	}
	if exists(filepath.Join(flannelDir, "old2")) {
		t.Error("flannel's cache entry left after the DEL")
	}
	want := map[string]string{newAddr.String(): "new1/eth0"}
	for _, cid := range []string{"old1", "old3", "old4"} {
		want[old[cid].String()] = cid + "/eth0"
	}
	if diff := cmp.Diff(want, l.reservationsOf(flannelNetwork)); diff != "" {
		t.Errorf("reservations after the DEL (-want +got):\n%s", diff)
	}
	l.mustDel(list, oldRT["old2"]) // repeated DEL succeeds

	// The released address is free for new pods again.
	if got := podAddr(t, l.mustAdd(list, rtOf("new3", testenv.NewNS(t)))); got != old["old2"] {
		t.Errorf("new pod after the DEL got %s, want the released %s", got, old["old2"])
	}
}

// TestIntegrationFlannelCorruptEntry: flannel's entry of an old pod is
// truncated (flannel writes it in place). DEL still releases the address
// and removes the veth, by re-rendering from subnet.env (flanneld's
// format), and leaves the file it could not recognise where it is.
func TestIntegrationFlannelCorruptEntry(t *testing.T) {
	l := newLab(t)
	env := l.writeFlannelEnv(testLease)
	flannelDir := filepath.Join(t.TempDir(), "flannel")
	pod := testenv.NewNS(t)
	rt := rtOf("old1", pod)
	addr := l.flannelAdd(flannelDir, env, rt)
	entry := filepath.Join(flannelDir, "old1")
	if err := os.Truncate(entry, 17); err != nil {
		t.Fatal(err)
	}
	list := l.flannelConflist(flannelDir)
	l.mustDel(list, rt)
	if v := inspectPod(t, pod); v.exists {
		t.Error("eth0 still in the pod after DEL")
	}
	if _, ok := l.reservationsOf(flannelNetwork)[addr.String()]; ok {
		t.Errorf("address %s still reserved", addr)
	}
	if !exists(entry) {
		t.Error("the unrecognised file in flannel's cache was removed")
	}
}
