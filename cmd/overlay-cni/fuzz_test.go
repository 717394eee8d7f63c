package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/overlaynet/overlay/delegate"
	"github.com/overlaynet/overlay/internal/testing/cnifuzz"
)

// FuzzPluginMain drives overlay-cni's real entry point (run: the CNI
// library's skel with overlay-cni's verbs) in-process, with arbitrary
// CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_ARGS, CNI_PATH,
// CNI_NETNS(_OVERRIDE) and stdin, a fake delegate and a sandbox (package
// cnifuzz). Invariants: no panic, no hang; exit status 0 or 1; on 1,
// stdout is exactly one CNI error JSON object with a code other than 0 and
// 999; on 0, stdout is one result in the request's cniVersion (ADD), the
// version list (VERSION) or empty; nothing in the sandbox changed but what
// cnifuzz.Policy allows for the verb; the delegate only ever run as a plain
// plugin name.
func FuzzPluginMain(f *testing.F) {
	confs := []string{
		`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni"}`,
		`{"cniVersion":"0.4.0","name":"overlay","type":"overlay-cni","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.244.7.2/24"}]}}`,
		`{"cniVersion":"1.1.0","name":"overlay","prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.244.7.2/24"}]},"cni.dev/valid-attachments":[{"containerID":"../x","ifname":"eth0"}]}`,
		`{"cniVersion":"0.3.1","name":"overlay","dataDir":"/var/lib/cni/overlay","subnetFile":"/run/overlay/subnet.env"}`,
		`{"cniVersion":"0.2.0","name":"overlay"}`, `{"cniVersion":"1.1.0","name":"../../etc"}`, `{"name":"overlay"}`,
		`{"cniVersion":"1.1.0","name":"overlay","delegate":{"type":"/bin/sh"}}`, `{`, ``, `null`,
	}
	commands := []string{"ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "", "add", "ADD\x00", "../../ADD"}
	ids := [][2]string{
		{"c1", "eth0"}, {"../../outside/secret", "eth0"}, {"c1", "../x"}, {"c1", "eth0\x00"}, {"/abs", "eth0"},
		{strings.Repeat("a", 230), "eth0"}, {"c1", ".."}, {"ünï", "eth0"}, {"", ""}, {"c1", "eth0:1"},
	}
	for i, conf := range confs {
		for j, cmd := range commands {
			id := ids[(i+j)%len(ids)]
			f.Add(cmd, []byte(conf), id[0], id[1], uint8(i+j), "K8S_POD_NAME=../../x;IgnoreUnknown=1", "/opt/cni/bin",
				uint8(j), uint8(i), uint8(0), j%3 == 0, "/var/lib/cni/../../etc", uint8(0))
		}
	}
	for sel := range uint8(8) { // every CNI_NETNS, including a FIFO and the plugin's own namespace
		for _, cmd := range []string{"ADD", "DEL", "CHECK"} {
			f.Add(cmd, []byte(confs[1]), "c1", "eth0", sel, "", "/opt/cni/bin", uint8(0), uint8(0), uint8(0), false, "", uint8(0))
		}
	}
	f.Fuzz(func(t *testing.T, command string, stdin []byte, cid, ifname string, netnsSel uint8, cniArgs, cniPath string,
		dataSel, envSel, ipamSel uint8, override bool, free string, fail uint8) {
		pluginMainCase{
			Command: command, Stdin: stdin, ContainerID: cid, IfName: ifname, NetNS: netnsSel, Args: cniArgs, Path: cniPath,
			DataDir: dataSel, SubnetFile: envSel, IPAM: ipamSel, Override: override, Free: free, Fail: fail,
		}.run(t)
	})
}

type pluginMainCase struct {
	Command                   string
	Stdin                     []byte
	ContainerID, IfName       string
	NetNS                     uint8 // cnifuzz.NetNSValue selector
	Args, Path                string
	DataDir, SubnetFile, IPAM uint8 // cnifuzz.*Value selectors
	Override                  bool
	Free                      string
	Fail                      uint8 // bit i fails the delegate's verb i of ADD, DEL, CHECK, STATUS, GC
}

// env strips NUL: an environment variable cannot hold one.
func env(s string) string { return strings.ReplaceAll(s, "\x00", "") }

func (pc pluginMainCase) run(t *testing.T) (exit int, stdout []byte) {
	sb := cnifuzz.New(t)
	dataV, _ := sb.DataDirValue(pc.DataDir, pc.Free)
	envV, _ := sb.SubnetFileValue(pc.SubnetFile, pc.Free)
	conf := cnifuzz.Confine(pc.Stdin, dataV, envV, sb.IPAMDataDirValue(pc.IPAM, pc.Free))
	command, cid, ifname := env(pc.Command), env(pc.ContainerID), env(pc.IfName)
	policy := cnifuzz.Policy{Verb: "nothing"}
	c, perr := delegate.ParseConf(conf)
	if perr == nil {
		if err := sb.CheckConfined(map[string]string{"dataDir": c.DataDir, "subnetFile": c.SubnetFile, "host-local directory": c.HostLocalDir()}); err != nil {
			t.Fatalf("accepted configuration: %v", err)
		}
		sb.PrepareHostLocal(c.HostLocalDir(), false)
		if slices.Contains([]string{"ADD", "DEL", "CHECK", "STATUS", "GC"}, command) {
			policy = cnifuzz.Policy{Verb: command, DataDir: c.DataDir, HostLocalDir: c.HostLocalDir(),
				Network: c.Name, ContainerID: cid, IfName: ifname}
		}
	}
	override := ""
	if pc.Override {
		override = "1"
	}
	for k, v := range map[string]string{
		"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
		"CNI_NETNS": sb.NetNSValue(pc.NetNS, pc.Free), "CNI_ARGS": env(pc.Args), "CNI_PATH": env(pc.Path),
		"CNI_NETNS_OVERRIDE": override,
	} {
		t.Setenv(k, v)
	}
	inv := &fakeInvoker{fail: pc.Fail}
	before := sb.Snapshot(t)
	exit, stdout = runInProcess(t, inv, conf)
	changes := cnifuzz.Diff(before, sb.Snapshot(t))

	if err := policy.Check(changes); err != nil {
		t.Fatalf("%v\n(exit %d, stdout %s)", err, exit, stdout)
	}
	for _, cl := range inv.calls {
		attVerb := command == "ADD" || command == "DEL" || command == "CHECK"
		if perr != nil || cl.plugin != c.DelegateType || attVerb && (cl.rt.ContainerID != cid || cl.rt.IfName != ifname) {
			t.Fatalf("%s ran the delegate %q %s with %+v", command, cl.plugin, cl.verb, cl.rt)
		}
	}
	switch exit {
	case 1:
		dec := json.NewDecoder(bytes.NewReader(stdout))
		var e struct {
			Code uint   `json:"code"`
			Msg  string `json:"msg"`
		}
		if err := dec.Decode(&e); err != nil || e.Code == 0 || e.Code == types.ErrInternal || e.Msg == "" {
			t.Fatalf("%s failed with stdout %q: want one CNI error object with a code (%v)", command, stdout, err)
		}
		if _, err := dec.Token(); err != io.EOF {
			t.Fatalf("%s failed with stdout %q: more than one JSON value", command, stdout)
		}
	case 0:
		switch command {
		case "ADD":
			var res struct {
				CNIVersion string `json:"cniVersion"`
			}
			dec := json.NewDecoder(bytes.NewReader(stdout))
			if err := dec.Decode(&res); err != nil || perr != nil || res.CNIVersion != c.CNIVersion {
				t.Fatalf("ADD succeeded with stdout %q", stdout)
			}
			if _, err := dec.Token(); err != io.EOF {
				t.Fatalf("ADD succeeded with stdout %q: more than one JSON value", stdout)
			}
		case "VERSION":
			var v struct {
				Supported []string `json:"supportedVersions"`
			}
			if err := json.Unmarshal(stdout, &v); err != nil || len(v.Supported) != 5 {
				t.Fatalf("VERSION printed %q", stdout)
			}
		default:
			if len(stdout) != 0 {
				t.Fatalf("%q succeeded with stdout %q, want none", command, stdout)
			}
			if command != "" && perr != nil {
				t.Fatalf("%s of a configuration overlay-cni refuses (%v) succeeded", command, perr)
			}
		}
	default:
		t.Fatalf("exit status %d", exit)
	}
	return exit, stdout
}

// runInProcess runs run(inv) with stdin as standard input and returns its
// exit status and standard output (standard error is discarded).
func runInProcess(t *testing.T, inv delegate.Invoker, stdin []byte) (int, []byte) {
	t.Helper()
	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.Write(stdin); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()

	stdioMu.Lock()
	oldIn, oldOut, oldErr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = in, out, null
	exit := func() int {
		defer func() { os.Stdin, os.Stdout, os.Stderr = oldIn, oldOut, oldErr }()
		return run(inv)
	}()
	stdioMu.Unlock()

	data, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return exit, data
}

var stdioMu sync.Mutex

type invCall struct {
	verb, plugin string
	rt           delegate.Runtime
}

// fakeInvoker stands for the delegate: it records the calls and fails the
// verbs whose bit is set in fail.
type fakeInvoker struct {
	calls []invCall
	fail  uint8
}

func (f *fakeInvoker) do(verb, plugin string, rt delegate.Runtime) error {
	f.calls = append(f.calls, invCall{verb, plugin, rt})
	if f.fail&(1<<slices.Index([]string{"ADD", "DEL", "CHECK", "STATUS", "GC"}, verb)) != 0 {
		if f.fail&0x20 != 0 {
			return errors.New("fake delegate: exec format error")
		}
		return types.NewError(types.ErrTryAgainLater, "fake delegate: busy", "")
	}
	return nil
}

func (f *fakeInvoker) Add(_ context.Context, plugin string, _ []byte, rt delegate.Runtime) (types.Result, error) {
	if err := f.do("ADD", plugin, rt); err != nil {
		return nil, err
	}
	return &types100.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*types100.Interface{{Name: "cni0"}, {Name: rt.IfName, Sandbox: rt.NetNS}},
		IPs: []*types100.IPConfig{{
			Interface: types100.Int(1),
			Address:   net.IPNet{IP: net.IPv4(10, 244, 7, 2), Mask: net.CIDRMask(24, 32)},
			Gateway:   net.IPv4(10, 244, 7, 1),
		}},
	}, nil
}

func (f *fakeInvoker) Del(_ context.Context, plugin string, _ []byte, rt delegate.Runtime) error {
	return f.do("DEL", plugin, rt)
}

func (f *fakeInvoker) Check(_ context.Context, plugin string, _ []byte, rt delegate.Runtime) error {
	return f.do("CHECK", plugin, rt)
}

func (f *fakeInvoker) Status(_ context.Context, plugin string, _ []byte, rt delegate.Runtime) error {
	return f.do("STATUS", plugin, rt)
}

func (f *fakeInvoker) GC(_ context.Context, plugin string, _ []byte, rt delegate.Runtime) error {
	return f.do("GC", plugin, rt)
}

// DaemonReady: the daemon is ready (the fuzz target is about the plugin's
// input, not about overlayd).
func (f *fakeInvoker) DaemonReady(context.Context, string) error { return nil }

// InterfaceExists: the container's namespace is empty.
func (f *fakeInvoker) InterfaceExists(string, string) (bool, error) { return false, nil }
