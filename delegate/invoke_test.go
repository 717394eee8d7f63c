package delegate

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

// writePlugin writes an executable shell script named name into dir.
func writePlugin(t *testing.T, dir, name, script string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFindPlugin(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(a, "bridge"), []byte("not executable"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(a, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := writePlugin(t, b, "bridge", "exit 0\n")
	got, err := FindPlugin("bridge", a+":"+b)
	if err != nil || got != want {
		t.Errorf("FindPlugin(bridge) = %q, %v; want %q", got, err, want)
	}
	for _, name := range []string{"dir", "missing", "../bridge", b + "/bridge", "", ".."} {
		if _, err := FindPlugin(name, a+":"+b); !errors.Is(err, ErrPluginNotFound) {
			t.Errorf("FindPlugin(%q) = %v, want ErrPluginNotFound", name, err)
		}
	}
	if _, err := FindPlugin("bridge", ""); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("FindPlugin with an empty CNI_PATH = %v, want ErrPluginNotFound", err)
	}
}

func TestExecInvokerEnvironmentAndResult(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	stdinFile := filepath.Join(dir, "stdin")
	writePlugin(t, dir, "probe", `env > `+envFile+`
cat > `+stdinFile+`
echo "probe says hi" >&2
echo '{"ips":[{"address":"10.244.7.2/24"}]}'
`)
	t.Setenv("CNI_CONTAINERID", "the-runtimes-own")
	t.Setenv("OVERLAY_TEST_INHERITED", "yes")
	var stderr bytes.Buffer
	inv := NewExecInvoker(&stderr)
	conf := []byte(`{"cniVersion":"1.0.0","name":"n","type":"probe"}`)
	rt := Runtime{ContainerID: "c1", NetNS: "/proc/self/ns/net", IfName: "eth0", Args: "K8S_POD_NAME=p", Path: dir}
	res, err := inv.Add(context.Background(), "probe", conf, rt)
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	if res.Version() != "1.0.0" {
		t.Errorf("result version %q, want the configuration's 1.0.0", res.Version())
	}
	envData, _ := os.ReadFile(envFile)
	env := map[string]string{}
	for _, line := range strings.Split(string(envData), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	want := map[string]string{
		"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
		"CNI_ARGS": "K8S_POD_NAME=p", "CNI_PATH": dir, "OVERLAY_TEST_INHERITED": "yes",
	}
	got := map[string]string{}
	for k := range want {
		got[k] = env[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delegate environment (-want +got):\n%s", diff)
	}
	if stdin, _ := os.ReadFile(stdinFile); !bytes.Equal(stdin, conf) {
		t.Errorf("delegate stdin %q, want %q", stdin, conf)
	}
	if !strings.Contains(stderr.String(), "probe says hi") {
		t.Errorf("delegate stderr not passed on: %q", stderr.String())
	}
	for verb, f := range map[string]func(context.Context, string, []byte, Runtime) error{
		"DEL": inv.Del, "CHECK": inv.Check, "STATUS": inv.Status, "GC": inv.GC,
	} {
		if err := f(context.Background(), "probe", conf, rt); err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		envData, _ := os.ReadFile(envFile)
		if !strings.Contains(string(envData), "CNI_COMMAND="+verb+"\n") {
			t.Errorf("%s ran the delegate with\n%s", verb, envData)
		}
	}
}

func TestExecInvokerErrors(t *testing.T) {
	dir := t.TempDir()
	writePlugin(t, dir, "cnierror", `echo '{"cniVersion":"1.1.0","code":11,"msg":"busy","details":"later"}'; exit 1`+"\n")
	writePlugin(t, dir, "stderronly", `echo "it broke" >&2; exit 3`+"\n")
	writePlugin(t, dir, "garbage", `echo 'not json'; exit 1`+"\n")
	writePlugin(t, dir, "silent", "exit 1\n")
	writePlugin(t, dir, "badresult", "echo '{\"ips\":5}'\n")
	inv := NewExecInvoker(nil)
	rt := Runtime{Path: dir}
	conf := []byte(`{"cniVersion":"1.1.0","name":"n"}`)

	err := inv.Del(context.Background(), "cnierror", conf, rt)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != 11 || te.Msg != "busy" || te.Details != "later" {
		t.Errorf("CNI error = %#v, want code 11 busy/later", err)
	}
	for plugin, want := range map[string]string{"stderronly": "it broke", "garbage": "not json", "silent": "no error message"} {
		err := inv.Del(context.Background(), plugin, conf, rt)
		if !errors.As(err, &te) || !strings.Contains(te.Msg, want) {
			t.Errorf("%s: error %v, want a CNI error mentioning %q", plugin, err, want)
		}
	}
	if _, err := inv.Add(context.Background(), "badresult", conf, rt); err == nil {
		t.Error("Add accepted an undecodable result")
	} else if te := delegateError("ADD", "badresult", err); !strings.Contains(te.Msg, "printed a result overlay-cni cannot use") {
		// It ran: "check that it is installed" would send the operator astray.
		t.Errorf("undecodable result reported as %q", te.Msg)
	}
	if err := inv.Del(context.Background(), "missing", conf, rt); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("missing plugin: %v, want ErrPluginNotFound", err)
	}
}
