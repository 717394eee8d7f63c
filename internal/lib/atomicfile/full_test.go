package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestWriteToAFullFileSystem: a write that runs out of space fails with an
// error that names the path once (not the temporary file) and wraps
// ENOSPC, and leaves no temporary file behind.
func TestWriteToAFullFileSystem(t *testing.T) {
	var werr error
	var left []string
	err := testenv.InFullFS(t, func(dir string) error {
		path := filepath.Join(dir, "subnet.env")
		werr = Write(path, []byte(strings.Repeat("OVERLAY_NETWORK=10.244.0.0/16\n", 10)), 0o644)
		entries, err := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, e.Name())
		}
		if werr != nil && strings.Count(werr.Error(), "subnet.env") != 1 {
			t.Errorf("error %q names the file more than once (or not at all)", werr)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("Write = %v, want ENOSPC", werr)
	}
	if strings.Contains(werr.Error(), ".tmp-") {
		t.Errorf("error %q names the temporary file", werr)
	}
	if len(left) != 0 {
		t.Errorf("files left in the directory: %q", left)
	}
	t.Logf("error: %v", werr)
}
