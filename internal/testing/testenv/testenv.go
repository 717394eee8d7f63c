// Package testenv answers the questions every privileged test asks: may I
// run here, and where are the binaries the Makefile built? Under CI=true a
// test that cannot run fails instead of skipping, so a CI run can never pass
// by silently testing nothing.
package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips t, or fails it under CI, because a prerequisite is missing.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true and this test cannot run: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot stops t unless it runs as root (needed for network namespaces).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root to create network namespaces (run as root, e.g. sudo make test)")
	}
}

// RepoRoot returns the directory holding go.mod, found by walking up from the
// test's working directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the test's working directory")
		}
		dir = parent
	}
}

// Binary returns the path of a binary built by the Makefile under bin/ (for
// example "overlayd" or "cni/bridge"), stopping t if it is missing.
func Binary(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(RepoRoot(t), "bin", name)
	if _, err := os.Stat(path); err != nil {
		Unavailable(t, "%s is not built: run `make build plugins` first (%v)", path, err)
	}
	return path
}

// PluginDir returns bin/cni, where `make plugins` puts the upstream bridge,
// host-local, loopback and portmap plugins, stopping t if they are missing.
func PluginDir(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		Binary(t, filepath.Join("cni", p))
	}
	return filepath.Join(RepoRoot(t), "bin", "cni")
}
