package testenv

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
)

// hostile is what an operator of a migrating cluster may have exported.
var hostile = map[string]string{
	"OVERLAY_ENDPOINTS": "http://127.0.0.1:1", "OVERLAY_LOG_FORMAT": "json",
	"FLANNELD_IFACE": "nope0", "FLANNELD_BIN": "/x", "ETCDCTL_ENDPOINTS": "http://127.0.0.1:1",
	"CNI_COMMAND": "DEL", "CNI_NETNS_OVERRIDE": "1", "CONTAINERS_CONF": "/x",
	"NODE_NAME": "someone-else", "KUBECONFIG": "/nonexistent",
}

func setHostile(t *testing.T) {
	for k, v := range hostile {
		t.Setenv(k, v)
	}
	t.Setenv("OVERLAY_TEST_KEPT_BY_NAME", "x") // a prefix match: dropped too
}

func names(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		out = append(out, name)
	}
	return out
}

func TestProgramEnvDropsTheCallersSettings(t *testing.T) {
	setHostile(t)
	t.Setenv("NODE_NAMES", "kept: not the variable NODE_NAME")
	env := ProgramEnv("OVERLAY_ENDPOINTS=unix:///lab", "NODE_NAME=n1")
	got := names(env)
	for _, name := range []string{"FLANNELD_IFACE", "FLANNELD_BIN", "ETCDCTL_ENDPOINTS", "CNI_COMMAND", "CNI_NETNS_OVERRIDE",
		"CONTAINERS_CONF", "KUBECONFIG", "OVERLAY_LOG_FORMAT", "OVERLAY_TEST_KEPT_BY_NAME"} {
		if slices.Contains(got, name) {
			t.Errorf("ProgramEnv kept the caller's %s", name)
		}
	}
	for _, want := range []string{"OVERLAY_ENDPOINTS=unix:///lab", "NODE_NAME=n1", "NODE_NAMES=kept: not the variable NODE_NAME"} {
		if !slices.Contains(env, want) {
			t.Errorf("ProgramEnv lacks %s", want)
		}
	}
	if path := os.Getenv("PATH"); path != "" && !slices.Contains(env, "PATH="+path) {
		t.Errorf("ProgramEnv dropped PATH")
	}
}

// TestCNIExecGivesPluginsTheCallOnly runs a plugin through CNIExec as libcni
// does (invoke.Args.AsEnv: this process's environment plus the call's) and
// reads back the environment it got.
func TestCNIExecGivesPluginsTheCallOnly(t *testing.T) {
	setHostile(t)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "probe")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\nenv\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := &invoke.Args{Command: "ADD", ContainerID: "c1", NetNS: "/proc/self/ns/net", IfName: "eth0", Path: dir}
	out, err := CNIExec(os.Stderr).ExecPlugin(context.Background(), plugin, nil, args.AsEnv())
	if err != nil {
		t.Fatalf("ExecPlugin: %v", err)
	}
	env := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, want := range []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0", "CNI_PATH=" + dir} {
		if !slices.Contains(env, want) {
			t.Errorf("plugin environment lacks %s: %q", want, env)
		}
	}
	for _, name := range names(env) {
		if IsCallerSetting(name) && !slices.Contains(cniProtocol, name) {
			t.Errorf("plugin got the caller's %s", name)
		}
	}
}
