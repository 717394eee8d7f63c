package e2e

import (
	"debug/buildinfo"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// overlayd is built with gRPC's grpcnotrace tag (the Makefile's GOTAGS):
// without golang.org/x/net/trace, and the html/template it imports, the
// linker drops the methods nothing calls, and the binary every host runs
// and maps is 4 MB smaller (issue 33: a cold start's peak RSS). gRPC's
// tracing is off unless grpc.EnableTracing is set, which nothing does.
func TestOverlaydIsBuiltWithoutGRPCTracing(t *testing.T) {
	bin := filepath.Join(testenv.RepoRoot(t), "bin", "overlayd")
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("read the build information of %s (run `make build`): %v", bin, err)
	}
	var tags string
	for _, s := range info.Settings {
		if s.Key == "-tags" {
			tags = s.Value
		}
	}
	if !slices.Contains(strings.Split(tags, ","), "grpcnotrace") {
		t.Errorf("%s was built with tags %q, want grpcnotrace (build it with `make build`)", bin, tags)
	}
}
