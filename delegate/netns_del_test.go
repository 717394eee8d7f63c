package delegate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// A DEL whose CNI_NETNS cannot be looked at must not release the address:
// the namespace may be a running pod's, whose interface would stay while
// host-local handed its address to the next pod. It fails with code 11,
// delegates nothing and keeps the cache entry. Only a definite answer (the
// path names nothing, or no namespace) makes DEL pass the path on empty.
func TestDelOnlyBlanksANetNSThatIsDefinitelyGone(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	failStat := func(errno unix.Errno) func(string) error {
		return func(path string) error {
			return probeNetNS(path, func(p string) (fs.FileInfo, error) {
				return nil, &fs.PathError{Op: "stat", Path: p, Err: errno}
			}, unix.Statfs)
		}
	}
	failStatfs := func(errno unix.Errno) func(string) error {
		return func(path string) error {
			return probeNetNS(path, os.Stat, func(string, *unix.Statfs_t) error { return errno })
		}
	}
	for _, tc := range []struct {
		name  string
		netns string
		probe func(string) error // nil: networkNamespace
		// retry: DEL fails with 11; otherwise it succeeds with an empty netns.
		retry bool
	}{
		{name: "stat EACCES", netns: file, probe: failStat(unix.EACCES), retry: true},
		{name: "stat EIO", netns: file, probe: failStat(unix.EIO), retry: true},
		{name: "statfs EACCES", netns: file, probe: failStatfs(unix.EACCES), retry: true},
		{name: "statfs EIO", netns: file, probe: failStatfs(unix.EIO), retry: true},
		{name: "symlink loop", netns: loop, retry: true},
		{name: "missing", netns: filepath.Join(dir, "missing")},
		{name: "component is a file", netns: filepath.Join(file, "net")},
		{name: "regular file", netns: file},
		{name: "directory", netns: dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.add("c1")
			if tc.probe != nil {
				fx.plugin.netns = tc.probe
			} else {
				fx.plugin.netns = networkNamespace
			}
			args := fx.args("c1", "eth0", fx.conf("1.1.0"))
			args.Netns = tc.netns
			err := fx.plugin.Del(args)
			if !tc.retry {
				if err != nil {
					t.Fatalf("Del: %v", err)
				}
				if del := fx.inv.calls[len(fx.inv.calls)-1]; del.Verb != "DEL" || del.RT.NetNS != "" {
					t.Errorf("last delegate call = %+v, want a DEL with an empty netns", del)
				}
				if exists(fx.cacheFile("c1", "eth0")) {
					t.Error("cache entry left after a successful DEL")
				}
				return
			}
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
				t.Fatalf("Del = %v, want a CNI error with code %d", err, types.ErrTryAgainLater)
			}
			if !strings.Contains(te.Msg, tc.netns) || !strings.Contains(te.Msg, "nothing was released") {
				t.Errorf("message %q does not name the path and say nothing was released", te.Msg)
			}
			if got := fx.inv.verbs(); len(got) != 1 || got[0] != "ADD" {
				t.Errorf("delegate calls = %v, want only the ADD", got)
			}
			if !exists(fx.cacheFile("c1", "eth0")) {
				t.Error("cache entry removed by a DEL that released nothing")
			}
		})
	}
}
