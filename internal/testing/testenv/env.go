package testenv

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
)

// callerSettings are the variables of the caller's shell that change what
// overlayd, overlay-cni, the delegate plugins or a container runtime do: an
// operator of a migrating cluster runs `make test` with flannel's or
// overlay's settings exported, and a test must pass all the same. Entries
// ending in "_" are prefixes, the others whole names.
var callerSettings = []string{
	"OVERLAY_", "FLANNELD_", "ETCDCTL_", "CNI_", "CONTAINERS_",
	"NODE_NAME", "KUBECONFIG",
}

// IsCallerSetting reports whether the variable name is one of callerSettings.
func IsCallerSetting(name string) bool {
	for _, s := range callerSettings {
		if name == s || strings.HasSuffix(s, "_") && strings.HasPrefix(name, s) {
			return true
		}
	}
	return false
}

// ProgramEnv is the environment for a program a test runs: this process's
// environment less every caller setting (PATH, HOME, the toolchain's and
// the like stay), then extra, the variables the test means to set.
func ProgramEnv(extra ...string) []string {
	return append(withoutCallerSettings(os.Environ(), nil), extra...)
}

// withoutCallerSettings drops the caller settings from environ, but for
// the names in keep.
func withoutCallerSettings(environ, keep []string) []string {
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return IsCallerSetting(name) && !slices.Contains(keep, name)
	})
}

// cniProtocol are the variables libcni sets for every plugin it runs
// (invoke.Args.AsEnv), over any the caller exported.
var cniProtocol = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"}

// CNIExec is a libcni executor, like invoke.DefaultExec with stderr as the
// plugins' standard error, that runs each plugin with ProgramEnv's
// environment plus the protocol's variables of the call: libcni itself
// hands a plugin this process's whole environment.
func CNIExec(stderr io.Writer) invoke.Exec {
	return programExec{&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}}}
}

type programExec struct{ *invoke.DefaultExec }

func (e programExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	return e.DefaultExec.ExecPlugin(ctx, pluginPath, stdinData, withoutCallerSettings(environ, cniProtocol))
}
