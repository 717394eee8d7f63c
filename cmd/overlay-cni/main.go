// Command overlay-cni is the overlay network's CNI plugin. It lives in
// /opt/cni/bin and is exec'd by the container runtime for every pod; all of
// its logic is in package delegate (see Documentation/cni.md).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/overlaynet/overlay/delegate"
	ovversion "github.com/overlaynet/overlay/internal/version"
)

func main() {
	os.Exit(run(delegate.NewExecInvoker(os.Stderr)))
}

// versions are the CNI versions overlay-cni supports.
var versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// newestVersion answers errors of requests whose cniVersion is unreadable.
const newestVersion = "1.1.0"

// run is the plugin's entry point with the delegate invoker as a parameter,
// so that tests drive it in-process with a fake delegate. It does what
// skel.PluginMainFuncs does (environment and stdin in, result or CNI error
// JSON on stdout) but returns the exit status instead of exiting, and
// prints errors with the request's cniVersion, as the spec's error format
// has it (the CNI library leaves it out).
func run(inv delegate.Invoker) int {
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		return printError(newestVersion, types.NewError(types.ErrIOFailure, "cannot read the network configuration from stdin", err.Error()))
	}
	// skel reads its stdin itself: hand it the bytes through a pipe.
	r, w, err := os.Pipe()
	if err != nil {
		return printError(requestVersion(stdin), types.NewError(types.ErrIOFailure, "cannot pass the network configuration on", err.Error()))
	}
	go func() {
		_, _ = w.Write(stdin)
		_ = w.Close()
	}()
	oldStdin := os.Stdin
	os.Stdin = r
	p := delegate.New(inv, os.Stdout, os.Stderr)
	e := skel.PluginMainFuncsWithError(p.Funcs(), versions, about())
	os.Stdin = oldStdin
	_ = r.Close()
	if e != nil {
		return printError(requestVersion(stdin), e)
	}
	return 0
}

// requestVersion is the request's cniVersion, or the newest supported one
// when the configuration has none that can be read (or one too long to be
// a version).
func requestVersion(stdin []byte) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if json.Unmarshal(stdin, &c) != nil || c.CNIVersion == "" || len(c.CNIVersion) > 16 {
		return newestVersion
	}
	return c.CNIVersion
}

// printError prints e as the spec's error object
// {"cniVersion", "code", "msg", "details"} on stdout and returns 1.
func printError(cniVersion string, e *types.Error) int {
	out := struct {
		CNIVersion string `json:"cniVersion"`
		*types.Error
	}{cniVersion, e}
	data, err := json.Marshal(out)
	if err == nil {
		_, err = os.Stdout.Write(append(data, '\n'))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlay-cni: cannot write the error to stdout: %v\n", err)
	}
	return 1
}

// about is printed when the plugin is run without CNI_COMMAND: the build's
// version (make sets it with -ldflags from git describe).
func about() string {
	return fmt.Sprintf("CNI plugin overlay-cni %s (%s, CNI spec versions 0.3.0-1.1.0)", ovversion.String(), runtime.Version())
}
