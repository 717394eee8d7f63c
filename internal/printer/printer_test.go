package printer

import (
	"bytes"
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
// quoted: one cell, one line, nothing raw on the terminal. Spaces and
// printable non-ASCII stay as they are.
func TestUnplainCellsAreQuoted(t *testing.T) {
	out := Output{Rows: [][]string{{"10.244.1.0/24", "a\tc\n\x1b[2J\"d", "héllo wörld"}}}
	for f, want := range map[Format]string{
		Simple: "10.244.1.0/24 \"a\\tc\\n\\x1b[2J\\\"d\" héllo wörld\n",
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
