package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// existingFile returns the path of a file holding older, longer contents in
// a fresh directory.
func existingFile(t *testing.T) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old contents that are longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

// checkOnlyFile fails t unless path holds want with mode perm and is the only
// entry of dir (no temporary file left behind).
func checkOnlyFile(t *testing.T, dir, path, want string, perm os.FileMode) {
	t.Helper()
	if got, err := os.ReadFile(path); err != nil || string(got) != want {
		t.Errorf("contents = %q, %v; want %q", got, err, want)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != perm {
		t.Errorf("mode = %v, want %v", st.Mode().Perm(), perm)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (temporary file left behind?)", len(entries))
	}
}

func TestWriteReplacesWholeFileWithMode(t *testing.T) {
	dir, path := existingFile(t)
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatalf("Write: %v", err)
	}
	checkOnlyFile(t, dir, path, "new", 0o600)
}

func TestWriteMissingDirectoryFailsAndNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "f")
	err := Write(path, []byte("x"), 0o644)
	if err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %v does not wrap a not-exist error", err)
	}
}

func TestPublishIsVisibleAtOnceAndSyncCompletesIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	p, err := Publish(path, []byte("new"), 0o600)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// Before Sync, every reader already sees the whole new file.
	checkOnlyFile(t, dir, path, "new", 0o600)
	if err := p.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	checkOnlyFile(t, dir, path, "new", 0o600)
}

// Publish never replaces a file, however close together two publishers
// come: exactly one of them creates it, the others get ErrExist and
// leave nothing behind.
func TestPublishNeverReplacesAFile(t *testing.T) {
	dir, path := existingFile(t)
	if _, err := Publish(path, []byte("new"), 0o600); !errors.Is(err, ErrExist) {
		t.Fatalf("Publish over an existing file: %v, want ErrExist", err)
	}
	checkOnlyFile(t, dir, path, "old contents that are longer", 0o644)

	dir = t.TempDir()
	path = filepath.Join(dir, "f")
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p, err := Publish(path, []byte(strconv.Itoa(i)), 0o600)
			if err == nil {
				err = p.Sync()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("publishers %d and %d both created %s", won, i, path)
		case err == nil:
			won = i
		case !errors.Is(err, ErrExist):
			t.Fatalf("publisher %d: %v, want ErrExist", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no publisher created the file")
	}
	checkOnlyFile(t, dir, path, strconv.Itoa(won), 0o600)
}

func TestPublishIntoMissingDirectoryFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "f")
	if _, err := Publish(path, []byte("x"), 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Publish into a missing directory: %v, want a not-exist error", err)
	}
}

func TestPublishOverADirectoryFailsAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(path, []byte("x"), 0o644); err == nil {
		t.Fatal("Publish over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the directory (temporary file left behind?)", len(entries))
	}
}
