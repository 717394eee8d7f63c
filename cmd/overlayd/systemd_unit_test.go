package main

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// serviceSettings reads the [Service] section of a systemd unit: each
// key's values, in order (a key may repeat; a value is split at spaces).
func serviceSettings(t *testing.T, file string) map[string][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not key=value", file, line)
			}
			out[k] = append(out[k], strings.Fields(v)...)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestShippedSystemdUnit: the unit in deploy/systemd does what the docs
// rely on. A usage error (exit 2) is not restarted: no restart can fix a
// bad flag, and a restart every 2 s for ever hides it. Every subnet file
// the docs tell an operator to use lies in a directory the unit leaves
// writable under ProtectSystem=strict (the default one, and flanneld's
// /run/flannel/subnet.env of migrating-from-flannel.md), else overlayd
// fails at each start. And the lock `overlayd run` takes needs AF_UNIX.
func TestShippedSystemdUnit(t *testing.T) {
	root := testenv.RepoRoot(t)
	unit := serviceSettings(t, filepath.Join(root, "deploy/systemd/overlayd.service"))

	if !slices.Contains(unit["RestartPreventExitStatus"], strconv.Itoa(exitUsage)) {
		t.Errorf("RestartPreventExitStatus = %q: want %d (a usage error), or systemd restarts a bad flag every %s for ever",
			unit["RestartPreventExitStatus"], exitUsage, unit["RestartSec"])
	}
	if !slices.Contains(unit["RestrictAddressFamilies"], "AF_UNIX") {
		t.Errorf("RestrictAddressFamilies = %q: overlayd's one-per-host lock is an AF_UNIX socket", unit["RestrictAddressFamilies"])
	}

	files := []string{subnet.DefaultEnvFile}
	subnetFileFlag := regexp.MustCompile("--subnet-file\\s+(/[^\\s`]+)")
	for _, doc := range []string{"Documentation/migrating-from-flannel.md", "Documentation/configuration.md", "Documentation/operations.md"} {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range subnetFileFlag.FindAllStringSubmatch(string(data), -1) {
			files = append(files, m[1])
		}
	}
	slices.Sort(files)
	files = slices.Compact(files)
	if !slices.Contains(files, "/run/flannel/subnet.env") {
		t.Fatalf("the docs no longer show --subnet-file /run/flannel/subnet.env (found %q): update this test", files)
	}
	if got := unit["ProtectSystem"]; !slices.Equal(got, []string{"strict"}) {
		t.Fatalf("ProtectSystem = %q: this test checks the writable paths of ProtectSystem=strict", got)
	}
	var writable []string
	for _, d := range unit["RuntimeDirectory"] {
		writable = append(writable, path.Join("/run", d))
	}
	for _, p := range unit["ReadWritePaths"] {
		writable = append(writable, path.Clean(strings.TrimPrefix(p, "-")))
	}
	for _, f := range files {
		dir := path.Dir(f)
		if !slices.ContainsFunc(writable, func(w string) bool { return dir == w || strings.HasPrefix(dir, w+"/") }) {
			t.Errorf("--subnet-file %s (in the docs): %s is read-only under ProtectSystem=strict; writable: %q", f, dir, writable)
		}
	}
}

// TestHangupMessageIsDocumented: operations.md quotes what SIGHUP logs.
func TestHangupMessageIsDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "\n"+HangupIgnored+"\n") {
		t.Errorf("operations.md does not quote the SIGHUP message %q", HangupIgnored)
	}
}
