// Command overlay-cni is the overlay network's CNI plugin. It lives in
// /opt/cni/bin and is exec'd by the container runtime for every pod; all of
// its logic is in package delegate (see Documentation/cni.md).
package main

import (
	"os"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/overlaynet/overlay/delegate"
)

func main() {
	p := delegate.New(delegate.NewExecInvoker(os.Stderr), os.Stdout, os.Stderr)
	skel.PluginMainFuncs(p.Funcs(),
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		about())
}

// about is printed when the plugin is run without CNI_COMMAND.
func about() string {
	v := "(unknown version)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	return "CNI plugin overlay-cni " + v
}
