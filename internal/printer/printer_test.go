package printer

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestWriteFormats(t *testing.T) {
	out := Output{
		Header: []string{"SUBNET", "NODE"},
		Rows:   [][]string{{"10.244.1.0/24", "a"}, {"10.244.22.0/24", "bb"}},
		JSON:   map[string]int{"n": 2},
	}
	for _, tt := range []struct {
		f    Format
		want string
	}{
		{Table, "SUBNET          NODE\n10.244.1.0/24   a\n10.244.22.0/24  bb\n"},
		{Simple, "10.244.1.0/24 a\n10.244.22.0/24 bb\n"},
		{JSON, "{\n  \"n\": 2\n}\n"},
	} {
		var b bytes.Buffer
		if err := Write(&b, tt.f, out); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.f, b.String(), tt.want)
		}
	}
}

func TestParseFormat(t *testing.T) {
	for _, s := range []string{"table", "json", "simple"} {
		if _, err := ParseFormat(s); err != nil {
			t.Errorf("ParseFormat(%q) = %v", s, err)
		}
	}
	if _, err := ParseFormat("yaml"); err == nil {
		t.Error("ParseFormat(yaml) succeeded")
	}
}

// A cell from etcd with a tab, a newline or an escape sequence is printed
// quoted: one cell, one line, nothing raw on the terminal. Printable
// non-ASCII stays as it is; a space too, but in simple, where a field is
// one word, a cell with a space is quoted.
// TestSimpleSplitsByPosition: every row of -w simple splits into as many
// fields as it has cells, whatever they hold (regression: a value with a
// space, such as config's "0 (underlay MTU - 50)", or an empty one shifted
// every field after it).
func TestSimpleSplitsByPosition(t *testing.T) {
	rows := [][]string{
		{"Backend.MTU", "0 (underlay MTU - 50)", "x"},
		{"", "say \"hi\"", "x"},
		{"a", "b", "x"},
	}
	var b bytes.Buffer
	if err := Write(&b, Simple, Output{Rows: rows}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for i, line := range lines {
		fields := splitQuoted(t, line)
		if !slices.Equal(fields, rows[i]) {
			t.Errorf("line %q splits into %q, want %q", line, fields, rows[i])
		}
	}
}

// splitQuoted splits a line at spaces, reading a field that starts with a
// double quote as a Go string literal.
func splitQuoted(t *testing.T, line string) []string {
	var out []string
	for line != "" {
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			s, _ := strconv.Unquote(q)
			out = append(out, s)
			line = strings.TrimPrefix(line[len(q):], " ")
			continue
		}
		f, rest, _ := strings.Cut(line, " ")
		out, line = append(out, f), rest
	}
	return out
}

func TestUnplainCellsAreQuoted(t *testing.T) {
	out := Output{Rows: [][]string{{"10.244.1.0/24", "a\tc\n\x1b[2J\"d", "héllo wörld"}}}
	for f, want := range map[Format]string{
		Simple: "10.244.1.0/24 \"a\\tc\\n\\x1b[2J\\\"d\" \"héllo wörld\"\n",
		Table:  "10.244.1.0/24  \"a\\tc\\n\\x1b[2J\\\"d\"  héllo wörld\n",
	} {
		var b bytes.Buffer
		if err := Write(&b, f, out); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("%s:\n got %q\nwant %q", f, b.String(), want)
		}
	}
}

// In -w simple a cell with a backslash or a single quote is quoted (a
// shell's read or a shlex-style reader would take them for an escape or a
// quote), and so is a cell that is literally "-", which would read as
// None; None itself prints as a bare "-" in simple and table.
func TestSimpleQuotesEscapesQuotesAndALiteralDash(t *testing.T) {
	out := Output{Rows: [][]string{{`a\b`, "it's", "-", None, "x-y", "-"}}}
	for f, want := range map[Format]string{
		Simple: `"a\\b" "it's" "-" - x-y "-"` + "\n",
		Table:  `a\b  it's  -  -  x-y  -` + "\n",
	} {
		var b bytes.Buffer
		if err := Write(&b, f, out); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("%s:\n got %q\nwant %q", f, b.String(), want)
		}
	}
	var b bytes.Buffer
	if err := Write(&b, Simple, out); err != nil {
		t.Fatal(err)
	}
	fields := splitQuoted(t, strings.TrimSuffix(b.String(), "\n"))
	want := []string{`a\b`, "it's", "-", "-", "x-y", "-"}
	if !slices.Equal(fields, want) {
		t.Errorf("simple splits into %q, want %q", fields, want)
	}
}
