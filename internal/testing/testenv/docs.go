package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RepoFile returns a file of the repository, by its path from the root
// (for tests that check the documentation against the code).
func RepoFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(RepoRoot(t), path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// MarkdownTable returns the cells, trimmed, of each row of the first
// Markdown table of doc whose header row starts with header (the header
// and the separator left out), stopping t if there is none.
func MarkdownTable(t testing.TB, doc, header string) [][]string {
	t.Helper()
	var rows [][]string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case !in && strings.HasPrefix(line, header):
			in = true
		case in && strings.HasPrefix(line, "|---"):
		case in && strings.HasPrefix(line, "|"):
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows = append(rows, cells)
		case in:
			return rows
		}
	}
	if !in {
		t.Fatalf("no table with the header %q", header)
	}
	return rows
}
