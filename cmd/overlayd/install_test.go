package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// installFixture is a plugin binary and the shipped conflist, and the two
// directories of a host they go to.
type installFixture struct {
	plugin, conflist, binDir, confDir string
}

func newInstallFixture(t *testing.T) installFixture {
	t.Helper()
	dir := t.TempDir()
	fx := installFixture{
		plugin:   filepath.Join(dir, "src", "overlay-cni"),
		conflist: filepath.Join("..", "..", "deploy", "cni", "10-overlay.conflist"),
		binDir:   filepath.Join(dir, "host", "opt", "cni", "bin"),
		confDir:  filepath.Join(dir, "host", "etc", "cni", "net.d"),
	}
	if err := os.MkdirAll(filepath.Dir(fx.plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fx.plugin, []byte("\x7fELF the plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	return fx
}

func (fx installFixture) args(extra ...string) []string {
	return append([]string{"install-cni", "--plugin", fx.plugin, "--cni-bin-dir", fx.binDir, "--cni-conf-dir", fx.confDir}, extra...)
}

func TestInstallCNIPutsThePluginAndTheConflistInPlace(t *testing.T) {
	fx := newInstallFixture(t)
	r := run(t, "", "", fx.args("--conflist", fx.conflist, "-w", "json")...)
	if r.code != exitOK {
		t.Fatalf("install-cni: %+v", r)
	}
	var out struct{ Installed []string }
	if err := json.Unmarshal([]byte(r.out), &out); err != nil {
		t.Fatalf("-w json output %q: %v", r.out, err)
	}
	bin, conf := filepath.Join(fx.binDir, "overlay-cni"), filepath.Join(fx.confDir, "10-overlay.conflist")
	if strings.Join(out.Installed, " ") != bin+" "+conf {
		t.Errorf("installed %q, want %s and %s", out.Installed, bin, conf)
	}
	for path, want := range map[string]struct {
		from string
		perm os.FileMode
	}{bin: {fx.plugin, 0o755}, conf: {fx.conflist, 0o644}} {
		got, err := os.ReadFile(path)
		src, _ := os.ReadFile(want.from)
		if err != nil || string(got) != string(src) {
			t.Errorf("%s = %q, %v; want the content of %s", path, got, err, want.from)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want.perm {
			t.Errorf("%s mode = %v, %v; want %v", path, st.Mode().Perm(), err, want.perm)
		}
	}
	// Written through temporary files renamed into place: none are left.
	for _, dir := range []string{fx.binDir, fx.confDir} {
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("%s holds %d entries, want the installed file alone", dir, len(entries))
		}
	}

	// Again over the installed files (a DaemonSet pod restarted): the same.
	if r := run(t, "", "", fx.args("--conflist", fx.conflist)...); r.code != exitOK || !strings.Contains(r.out, "installed  "+bin) {
		t.Errorf("second install-cni: %+v", r)
	}
}

func TestInstallCNIRefusesWhatARuntimeCouldNotUse(t *testing.T) {
	fx := newInstallFixture(t)
	dir := t.TempDir()
	write := func(name, data string, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), perm); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notOurs := write("bridge.conflist", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}`, 0o644)
	broken := write("broken.conflist", `{"cniVersion":"1.0.0","name":"n","plugins":[`, 0o644)
	noPlugins := write("empty.conflist", `{"cniVersion":"1.0.0","name":"n"}`, 0o644)
	noName := write("noname.conflist", `{"cniVersion":"1.0.0","plugins":[{"type":"overlay-cni"}]}`, 0o644)
	plain := write("overlay-cni", "not executable", 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a conflist without overlay-cni", fx.args("--conflist", notOurs), "has no plugin of type overlay-cni"},
		{"a conflist that does not parse", fx.args("--conflist", broken), "is not a CNI network config list"},
		{"a conflist without plugins", fx.args("--conflist", noPlugins), "has no plugin of type overlay-cni"},
		{"a conflist without a name", fx.args("--conflist", noName), "it needs a name and a cniVersion"},
		{"a missing conflist", fx.args("--conflist", filepath.Join(dir, "nope")), "want a CNI network config list file"},
		{"a plugin that is not executable", append(fx.args(), "--plugin", plain), "want an executable file"},
		{"a missing plugin", append(fx.args(), "--plugin", filepath.Join(dir, "nope")), "want an executable file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", "", tc.args...)
			if r.code != exitUsage || !strings.Contains(r.err, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d saying %q", r.code, r.err, exitUsage, tc.want)
			}
			// Nothing is installed when anything is wrong.
			for _, d := range []string{fx.binDir, fx.confDir} {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					t.Errorf("%s exists after a refused install-cni", d)
				}
			}
		})
	}
}

// Without --plugin, a missing overlay-cni beside overlayd is no usage error:
// the user gave no flag to blame. The message says where it was looked for.
func TestInstallCNIWithoutPluginBesideOverlayd(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(filepath.Dir(self), "overlay-cni")
	if _, err := os.Stat(beside); err == nil {
		t.Skipf("%s exists", beside)
	}
	fx := newInstallFixture(t)
	r := run(t, "", "", "install-cni", "--cni-bin-dir", fx.binDir, "--cni-conf-dir", fx.confDir)
	want := "no executable overlay-cni beside overlayd (" + beside + "): give --plugin"
	if r.code != exitError || !strings.Contains(r.err, want) || strings.Contains(r.err, "--plugin "+beside) {
		t.Errorf("exit %d, stderr %q; want exit %d saying %q", r.code, r.err, exitError, want)
	}
	if _, err := os.Stat(fx.binDir); !os.IsNotExist(err) {
		t.Errorf("%s exists after a refused install-cni", fx.binDir)
	}
}

// A conflist that exists but cannot be read is exit 1, not a usage error:
// the value given was right. As root, EACCES cannot be had; /proc/self/mem
// is a regular file whose read at offset 0 fails with EIO.
func TestInstallCNIConflistReadErrorIsNoUsageError(t *testing.T) {
	fx := newInstallFixture(t)
	r := run(t, "", "", fx.args("--conflist", "/proc/self/mem")...)
	if r.code != exitError || !strings.Contains(r.err, "--conflist: read /proc/self/mem: ") || strings.Count(r.err, "/proc/self/mem") != 1 {
		t.Errorf("exit %d, stderr %q; want exit %d naming the read error and the file once", r.code, r.err, exitError)
	}
}

// Errors of writing name the path once (MkdirAll's and atomicfile's errors
// name it already).
func TestInstallCNIWriteErrorsNameThePathOnce(t *testing.T) {
	fx := newInstallFixture(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inFile := filepath.Join(file, "bin")
	taken := t.TempDir()
	if err := os.Mkdir(filepath.Join(taken, "overlay-cni"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ binDir, path string }{
		{inFile, inFile}, // a parent fails: create DIR: mkdir PARENT: …
		{"/proc/overlay-test", "/proc/overlay-test"}, // the directory itself fails: mkdir DIR: …
		{taken, filepath.Join(taken, "overlay-cni")},
	} {
		r := run(t, "", "", "install-cni", "--plugin", fx.plugin, "--cni-bin-dir", tc.binDir, "--cni-conf-dir", fx.confDir)
		if r.code != exitError || strings.Count(r.err, tc.path) != 1 {
			t.Errorf("--cni-bin-dir %s: exit %d, stderr %q; want exit %d naming %s once", tc.binDir, r.code, r.err, exitError, tc.path)
		}
	}
}
