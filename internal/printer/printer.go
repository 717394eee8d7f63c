// Package printer renders command output in the formats the CLI offers with
// -w/--write-out: an aligned table for people, JSON for programs, and
// "simple" (space-separated fields, no header) for shell pipelines. Commands
// build their rows and JSON value apart from rendering, as etcdctl does.
package printer

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
)

// Format is a -w value.
type Format string

// The output formats.
const (
	Table  Format = "table"
	JSON   Format = "json"
	Simple Format = "simple"
)

// ParseFormat validates a -w value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case Table, JSON, Simple:
		return f, nil
	}
	return "", fmt.Errorf("unknown output format %q: use table, json or simple", s)
}

// None is the cell for "no value": table and simple print it as "-". A
// cell that is literally "-" (a node ID anyone could write to etcd) is
// printed quoted by simple, so that it cannot read as none. None is no
// valid UTF-8, which no value decoded from JSON can be.
const None = "\xff(none)"

// Output is what a command prints: rows for table and simple, a value for JSON.
// Cells may hold what anyone could write to etcd (a hostname, a node ID):
// table and simple print a cell with a tab, a newline, an escape or any
// other unprintable rune quoted, so it can neither break the rows nor reach
// the terminal raw. Simple also quotes a cell that holds a space or a
// double quote or is empty, so that every row splits into its fields by
// position (a shell's read or awk see one word per field unless a value
// needs quoting, and shlex-style readers always do). It quotes a cell
// with a backslash or a single quote too (a shell's read and shlex-style
// readers would take them for escapes or quotes), and a cell that is
// literally "-", which would read as None.
type Output struct {
	Header []string
	Rows   [][]string
	JSON   any
}

// Write renders out to w in format f.
func Write(w io.Writer, f Format, out Output) error {
	switch f {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		// Values are written back as printed (config get -w json, then
		// config put): "&", "<" and ">" stay as they are stored.
		enc.SetEscapeHTML(false)
		return enc.Encode(out.JSON)
	case Simple:
		for _, r := range out.Rows {
			if _, err := fmt.Fprintln(w, strings.Join(simpleCells(r), " ")); err != nil {
				return err
			}
		}
		return nil
	default:
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if len(out.Header) > 0 {
			fmt.Fprintln(tw, strings.Join(out.Header, "\t"))
		}
		for _, r := range out.Rows {
			fmt.Fprintln(tw, strings.Join(cells(r), "\t"))
		}
		return tw.Flush()
	}
}

// simpleCells is cells, with a cell that holds a space, a double or
// single quote or a backslash, is empty, or is literally "-", quoted too:
// a field of -w simple is one word, and "-" alone means None.
func simpleCells(row []string) []string {
	out := cells(row)
	for i, c := range out {
		if row[i] == None || c != row[i] {
			continue // "-", or quoted already
		}
		if c == "" || c == "-" || strings.ContainsAny(c, " \"'\\") {
			out[i] = strconv.Quote(c)
		}
	}
	return out
}

// cells returns row with every cell that holds an unprintable rune quoted,
// and None as "-".
func cells(row []string) []string {
	out := make([]string, len(row))
	for i, c := range row {
		out[i] = c
		switch {
		case c == None:
			out[i] = "-"
		case strings.ContainsFunc(c, func(r rune) bool { return !unicode.IsPrint(r) }):
			out[i] = strconv.Quote(c)
		}
	}
	return out
}
