// Command overlay-cni is the overlay network's CNI plugin. It lives in
// /opt/cni/bin and is exec'd by the container runtime for every pod; all of
// its logic is in package delegate (see Documentation/cni.md).
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/overlaynet/overlay/delegate"
)

func main() {
	os.Exit(run(delegate.NewExecInvoker(os.Stderr)))
}

// versions are the CNI versions overlay-cni supports.
var versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// run is the plugin's entry point with the delegate invoker as a parameter,
// so that tests drive it in-process with a fake delegate. It does what
// skel.PluginMainFuncs does (environment and stdin in, result or CNI error
// JSON on stdout) but returns the exit status instead of exiting.
func run(inv delegate.Invoker) int {
	p := delegate.New(inv, os.Stdout, os.Stderr)
	if e := skel.PluginMainFuncsWithError(p.Funcs(), versions, about()); e != nil {
		if err := e.Print(); err != nil {
			fmt.Fprintf(os.Stderr, "overlay-cni: cannot write the error to stdout: %v\n", err)
		}
		return 1
	}
	return 0
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
