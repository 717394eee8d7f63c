package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/delegate"
	"github.com/overlaynet/overlay/internal/testing/lab"
)

// cniMode is one way of attaching a pod: overlay-cni with the project's
// plugin configuration, or the bridge plugin straight with the
// configuration overlay-cni renders for it.
type cniMode struct {
	name   string // the plugin binary
	plugin string // its path
	conf   []byte
}

// benchCNI measures CNI ADD and DEL as a container runtime runs them: the
// plugin exec'd from the host's namespace with the CNI_* environment and the
// configuration on stdin, for a pod namespace made beforehand. It is long
// (over 80 lines) as a script is: warm-up, sequential and concurrent runs
// share one lab host, its pod slots and the call helper, in the order
// Documentation/benchmarks.md describes.
func (b *bench) benchCNI(ctx context.Context) error {
	l, err := b.newLab(ctx, "cni", lab.DefaultNetworkConfig)
	if err != nil {
		return err
	}
	defer l.Close()
	n, err := l.AddNode("h1", 1)
	if err != nil {
		return err
	}
	if err := n.Start(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.WaitReady(rctx); err != nil {
		return err
	}
	modes, err := b.cniModes(n)
	if err != nil {
		return err
	}
	slots := make([]*lab.Namespace, b.cfg.CNIConc)
	for i := range slots {
		if slots[i], err = l.NewNamespace(fmt.Sprintf("cni-%d", i)); err != nil {
			return err
		}
		defer slots[i].Close()
	}
	cniPath := b.cfg.BinDir + string(filepath.ListSeparator) + filepath.Join(b.cfg.BinDir, "cni")
	seq := 0
	call := func(m cniMode, verb string, slot *lab.Namespace) (time.Duration, error) {
		id := fmt.Sprintf("bench-%s-%d", m.name, seq)
		return execCNI(n.NS, m, verb, id, slot.Path, cniPath)
	}
	// A first ADD/DEL of each mode: cni0 gets created, binaries cached.
	for _, m := range modes {
		seq++
		if _, err := call(m, "ADD", slots[0]); err != nil {
			return err
		}
		if _, err := call(m, "DEL", slots[0]); err != nil {
			return err
		}
	}

	// Sequential, the modes interleaved so that drift in the machine's
	// load hits both alike.
	addT := map[string][]float64{}
	delT := map[string][]float64{}
	for range b.cfg.CNIRuns {
		for _, m := range modes {
			seq++
			d, err := call(m, "ADD", slots[0])
			if err != nil {
				return err
			}
			addT[m.name] = append(addT[m.name], ms(d))
			if d, err = call(m, "DEL", slots[0]); err != nil {
				return err
			}
			delT[m.name] = append(delT[m.name], ms(d))
		}
	}
	for _, m := range modes {
		p := map[string]any{"plugin": m.name, "mode": "sequential"}
		b.add(result{Measure: "cni_add", Metric: "latency", Unit: "ms", Params: p}, addT[m.name])
		b.add(result{Measure: "cni_del", Metric: "latency", Unit: "ms", Params: p}, delT[m.name])
		b.logf("CNI %s sequential: ADD median %.2f ms, DEL median %.2f ms", m.name,
			summarize(addT[m.name], false).Median, summarize(delT[m.name], false).Median)
	}

	// Concurrent: CNIConc ADDs at once (each its own pod), then their DELs.
	addT, delT = map[string][]float64{}, map[string][]float64{}
	wallAdd, wallDel := map[string][]float64{}, map[string][]float64{}
	for range b.cfg.CNIBatches {
		for _, m := range modes {
			for _, verb := range []string{"ADD", "DEL"} {
				lat := make([]float64, len(slots))
				errs := make([]error, len(slots))
				var wg sync.WaitGroup
				start := time.Now()
				for i, slot := range slots {
					id := fmt.Sprintf("bench-%s-c%d-%d", m.name, seq, i)
					wg.Go(func() {
						d, err := execCNI(n.NS, m, verb, id, slot.Path, cniPath)
						lat[i], errs[i] = ms(d), err
					})
				}
				wg.Wait()
				wall := ms(time.Since(start))
				for _, err := range errs {
					if err != nil {
						return err
					}
				}
				if verb == "ADD" {
					addT[m.name] = append(addT[m.name], lat...)
					wallAdd[m.name] = append(wallAdd[m.name], wall)
				} else {
					delT[m.name] = append(delT[m.name], lat...)
					wallDel[m.name] = append(wallDel[m.name], wall)
				}
			}
			seq++
		}
	}
	for _, m := range modes {
		mode := fmt.Sprintf("concurrent-%d", b.cfg.CNIConc)
		p := map[string]any{"plugin": m.name, "mode": mode}
		b.add(result{Measure: "cni_add", Metric: "latency", Unit: "ms", Params: p}, addT[m.name])
		b.add(result{Measure: "cni_del", Metric: "latency", Unit: "ms", Params: p}, delT[m.name])
		b.add(result{Measure: "cni_add", Metric: "round_wall", Unit: "ms", Params: p}, wallAdd[m.name])
		b.add(result{Measure: "cni_del", Metric: "round_wall", Unit: "ms", Params: p}, wallDel[m.name])
	}
	return nil
}

// cniModes returns the two ways of attaching a pod on host n.
func (b *bench) cniModes(n *lab.Node) ([]cniMode, error) {
	// The project's conflist, first plugin, with what a runtime injects
	// (name, cniVersion) and the lab host's files.
	raw, err := os.ReadFile(filepath.Join(b.cfg.Root, "deploy", "cni", "10-overlay.conflist"))
	if err != nil {
		return nil, err
	}
	var list struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	var plugin map[string]any
	for _, p := range list.Plugins {
		if p["type"] == "overlay-cni" {
			plugin = p
		}
	}
	if plugin == nil {
		return nil, fmt.Errorf("no overlay-cni plugin in deploy/cni/10-overlay.conflist")
	}
	plugin["cniVersion"], plugin["name"] = list.CNIVersion, list.Name
	plugin["subnetFile"] = n.SubnetFile
	plugin["dataDir"] = filepath.Join(n.Dir, "bench-cni-cache")
	plugin["ipam"] = map[string]any{"dataDir": filepath.Join(n.Dir, "bench-ipam")}
	overlayConf, err := json.Marshal(plugin)
	if err != nil {
		return nil, err
	}
	// What overlay-cni hands the bridge plugin for this configuration.
	nc, err := delegate.ParseConf(overlayConf)
	if err != nil {
		return nil, err
	}
	env, err := n.Env()
	if err != nil {
		return nil, err
	}
	d, err := delegate.Render(nc, env)
	if err != nil {
		return nil, err
	}
	return []cniMode{
		{name: "bridge", plugin: filepath.Join(b.cfg.BinDir, "cni", d.Type), conf: d.Config},
		{name: "overlay-cni", plugin: filepath.Join(b.cfg.BinDir, "overlay-cni"), conf: overlayConf},
	}, nil
}

// execCNI runs one CNI verb from the host's namespace and times it, exec to
// exit.
func execCNI(hostNS netns.NsHandle, m cniMode, verb, containerID, netnsPath, cniPath string) (time.Duration, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(m.plugin)
	cmd.Env = []string{
		"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + containerID, "CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=eth0", "CNI_PATH=" + cniPath, "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
	}
	cmd.Stdin = bytes.NewReader(m.conf)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var d time.Duration
	err := lab.Do(hostNS, func() error {
		start := time.Now()
		err := cmd.Run()
		d = time.Since(start)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s %s %s: %w: %s %s", m.name, verb, containerID, err, stdout.String(), stderr.String())
	}
	return d, nil
}
