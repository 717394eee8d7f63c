// Package jsonobj reads JSON objects the way the lease and config
// documents are read: a fast reader of the plain shape nearly every lease
// value has (Plain), and a member-by-member decoder whose errors name the
// member as written and what it must be (Decode). Both subnet (lease
// values, the network config) and each backend (its own part of a lease
// value, e.g. backend/vxlan's BackendData) read with them, so a document
// is read one way whoever reads which part of it. It imports nothing of
// ours.
package jsonobj

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// What a member must be, in the user's words (Field.Want).
const (
	WantString = "a string"
	WantNumber = "a whole number"
)

// Plain reads a JSON object of the one plain shape nearly every lease
// value has (strings without escapes or non-ASCII bytes, integers, and
// objects of those), and gives up on anything else (escapes, non-ASCII,
// null, arrays, floats, member names that match a field only
// case-insensitively): a caller then decodes it with encoding/json. What
// a caller accepts through it must decode exactly as encoding/json does.

// Member is one member of an object read by Plain: kind 's' for a
// string (value without its quotes), 'n' an integer, 'o' an object (value
// with its braces, as it was written).
type Member struct {
	Name, Value []byte
	Kind        byte
}

// Plain calls visit with each member of data, a JSON object of
// strings without escapes or non-ASCII bytes, integers, and (nest > 0)
// objects of the same nest-1 deep. It returns false, having stopped, when
// data is anything else or visit returns false.
func Plain(data []byte, nest int, visit func(Member) bool) bool {
	end, ok := scanObject(data, skipSpace(data, 0), nest, visit)
	return ok && skipSpace(data, end) == len(data)
}

func scanObject(d []byte, i, nest int, visit func(Member) bool) (int, bool) {
	if i >= len(d) || d[i] != '{' {
		return 0, false
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, true
	}
	// A plain object names each field once: twin members (the same name
	// twice, or in another case) are left to the slow path, which refuses
	// them (twinsError). Plain names are ASCII, so EqualFold is exact.
	var names [16][]byte
	seen := 0
	for {
		nameEnd, ok := scanString(d, i)
		if !ok {
			return 0, false
		}
		m := Member{Name: d[i+1 : nameEnd-1]}
		if seen == len(names) {
			return 0, false
		}
		for _, n := range names[:seen] {
			if bytes.EqualFold(n, m.Name) {
				return 0, false
			}
		}
		names[seen] = m.Name
		seen++
		i = skipSpace(d, nameEnd)
		if i >= len(d) || d[i] != ':' {
			return 0, false
		}
		i = skipSpace(d, i+1)
		if i >= len(d) {
			return 0, false
		}
		start, end := i, 0
		switch c := d[i]; {
		case c == '"':
			m.Kind = 's'
			if end, ok = scanString(d, i); ok {
				m.Value = d[start+1 : end-1]
			}
		case c == '-' || c >= '0' && c <= '9':
			m.Kind = 'n'
			if end, ok = scanInteger(d, i); ok {
				m.Value = d[start:end]
			}
		case c == '{' && nest > 0:
			m.Kind = 'o'
			if end, ok = scanObject(d, i, nest-1, func(Member) bool { return true }); ok {
				m.Value = d[start:end]
			}
		default:
			return 0, false
		}
		if !ok || visit != nil && !visit(m) {
			return 0, false
		}
		i = skipSpace(d, end)
		if i >= len(d) {
			return 0, false
		}
		switch d[i] {
		case '}':
			return i + 1, true
		case ',':
			i = skipSpace(d, i+1)
		default:
			return 0, false
		}
	}
}

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the end of the string at d[i] (after its closing
// quote); only printable ASCII without a backslash is plain.
func scanString(d []byte, i int) (int, bool) {
	if i >= len(d) || d[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(d); j++ {
		switch c := d[j]; {
		case c == '"':
			return j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return 0, false
		}
	}
	return 0, false
}

// scanInteger returns the end of the JSON integer at d[i]: -?(0|[1-9][0-9]*),
// followed by neither a fraction nor an exponent.
func scanInteger(d []byte, i int) (int, bool) {
	if d[i] == '-' {
		i++
	}
	start := i
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		i++
	}
	switch {
	case i == start, i-start > 1 && d[start] == '0':
		return 0, false
	case i < len(d) && (d[i] == '.' || d[i] == 'e' || d[i] == 'E'):
		return 0, false
	}
	return i, true
}

// FoldsTo reports whether name matches one of fields case-insensitively,
// as encoding/json would match it, without being spelt exactly like it.
func FoldsTo(name []byte, fields ...string) bool {
	for _, f := range fields {
		if bytes.EqualFold(name, []byte(f)) {
			return true
		}
	}
	return false
}

// Field binds a JSON member to where its value goes. Dst is a *string,
// *int, **int, *bool or *json.RawMessage; Want says, in the user's words,
// what the value must be.
type Field struct {
	Name string
	Dst  any
	Want string
	// Sub, if set, decodes a nested object instead of Dst, given the
	// path of its members (e.g. "Backend.").
	Sub func(path string, raw json.RawMessage) error
}

// Decode decodes the JSON object data into fields, matching member
// names case-insensitively as encoding/json (and so flannel) does; other
// members are ignored and null is the same as absent. Errors name the
// member as written in the document, prefixed by path (e.g. "Backend."),
// say what it must be and quote what it is — never a Go type.
func Decode(path string, data []byte, fields []Field) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return SyntaxError(path, data, err)
	}
	if members == nil { // the whole value was null
		return fmt.Errorf("%swant a JSON object, got null", quotePath(path))
	}
	for _, f := range fields {
		key, raw, ok := member(members, f.Name)
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		if f.Sub != nil {
			if err := f.Sub(path+key+".", raw); err != nil {
				return err
			}
			continue
		}
		if err := json.Unmarshal(raw, f.Dst); err != nil {
			return fmt.Errorf("%q: want %s, got %s", path+key, f.Want, Excerpt(raw))
		}
	}
	return nil
}

// member finds name among members: an exact match first, else the first
// case-insensitive one in sorted order (deterministic).
func member(members map[string]json.RawMessage, name string) (string, json.RawMessage, bool) {
	if raw, ok := members[name]; ok {
		return name, raw, true
	}
	found := ""
	for k := range members {
		if strings.EqualFold(k, name) && (found == "" || k < found) {
			found = k
		}
	}
	return found, members[found], found != ""
}

// SyntaxError explains why data is not a JSON object.
func SyntaxError(path string, data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := Position(data, syn.Offset)
		return fmt.Errorf("%snot valid JSON at line %d, column %d: %s", quotePath(path), line, col, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%snot valid JSON: it ends early (an object, array or string is not closed)", quotePath(path))
	case errors.As(err, &typ):
		return fmt.Errorf("%swant a JSON object, got %s", quotePath(path), Excerpt(data))
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fmt.Errorf("%swant a JSON object, got nothing", quotePath(path))
	}
	return fmt.Errorf("%snot valid JSON: %s", quotePath(path), strings.TrimPrefix(err.Error(), "json: "))
}

func quotePath(path string) string {
	if path == "" {
		return ""
	}
	return fmt.Sprintf("%q: ", strings.TrimSuffix(path, "."))
}

// Position turns the offset json reports (the bytes read when the error
// was found) into the 1-based line and column of the last byte read.
func Position(data []byte, offset int64) (line, col int) {
	offset = max(1, min(offset, int64(len(data))))
	before := data[:offset-1]
	return bytes.Count(before, []byte("\n")) + 1, len(before) - bytes.LastIndexByte(before, '\n')
}

// Excerpt quotes a JSON value as written, shortened to stay one line.
func Excerpt(raw []byte) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	if s == "" {
		return "nothing"
	}
	return s
}
