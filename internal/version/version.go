// Package version holds the build version, set by the Makefile with -ldflags.
package version

import "runtime/debug"

// Version is overwritten at link time: -X .../internal/version.Version=v1.2.3
var Version = "dev"

// String returns the version, falling back to the module version that go
// install records when no -ldflags were given.
func String() string {
	if Version != "dev" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Version
}
