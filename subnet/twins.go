package subnet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// twinMembers finds, in the valid JSON document data, the first object
// (at any depth) with two members naming one field: the same name twice,
// or names that differ only in case. encoding/json — and so flanneld —
// matches member names case-insensitively and keeps the last, while a
// reader that takes the exact name (or the first) reads the other one:
// such a document means two things, and is refused. It returns the path of
// the object (e.g. "Backend.") and the two names as written, or ok false.
//
// It runs on every lease value a host reads, so it scans the bytes in one
// pass and allocates only for a member name written with escapes or an
// object of more than 16 members (and, to report twins, their path).
func twinMembers(data []byte) (path, first, second string, ok bool) {
	s := scanner{data: data}
	s.skipSpace()
	if _, _, _, ok := s.value("", nil); !ok {
		return "", "", "", false
	}
	// Found: scan again, spelling out the path this time.
	s = scanner{data: data, paths: true}
	s.skipSpace()
	return s.value("", nil)
}

type scanner struct {
	data  []byte
	i     int
	paths bool // build the path of nested objects (only to report one)
}

func (s *scanner) skipSpace() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value scans the value at s.i, the member name of the object at path
// (empty for the document or an array element).
func (s *scanner) value(path string, name []byte) (string, string, string, bool) {
	if s.i >= len(s.data) {
		return "", "", "", false
	}
	switch s.data[s.i] {
	case '{':
		if len(name) > 0 && s.paths {
			path += string(name) + "."
		}
		return s.object(path)
	case '[':
		s.i++
		for {
			s.skipSpace()
			if s.i >= len(s.data) || s.data[s.i] == ']' {
				s.i++
				return "", "", "", false
			}
			if s.data[s.i] == ',' {
				s.i++
				continue
			}
			if p, a, b, ok := s.value(path, name); ok {
				return p, a, b, ok
			}
		}
	case '"':
		s.str()
	default: // number, true, false, null
		start := s.i
		for s.i < len(s.data) && !strings.ContainsRune(" \t\n\r,]}", rune(s.data[s.i])) {
			s.i++
		}
		if s.i == start { // not valid JSON: never loop on it
			s.i++
		}
	}
	return "", "", "", false
}

// str skips the string at s.i and returns it as written, quotes included.
func (s *scanner) str() []byte {
	start := s.i
	s.i++
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			s.i += 2
			continue
		case '"':
			s.i++
			return s.data[start:s.i]
		}
		s.i++
	}
	return s.data[start:]
}

func (s *scanner) object(path string) (string, string, string, bool) {
	s.i++
	var buf [16][]byte
	names := buf[:0]
	for {
		s.skipSpace()
		if s.i >= len(s.data) {
			return "", "", "", false
		}
		switch s.data[s.i] {
		case '}':
			s.i++
			return "", "", "", false
		case ',':
			s.i++
			continue
		}
		name := memberName(s.str())
		for _, prev := range names {
			if sameField(prev, name) {
				return path, string(prev), string(name), true
			}
		}
		names = append(names, name)
		s.skipSpace()
		if s.i < len(s.data) && s.data[s.i] == ':' {
			s.i++
		}
		s.skipSpace()
		if p, a, b, ok := s.value(path, name); ok {
			return p, a, b, ok
		}
	}
}

// memberName is a quoted member name as encoding/json reads it.
func memberName(quoted []byte) []byte {
	if bytes.IndexByte(quoted, '\\') >= 0 {
		var name string
		if json.Unmarshal(quoted, &name) == nil {
			return []byte(name)
		}
	}
	return bytes.TrimSuffix(bytes.TrimPrefix(quoted, []byte(`"`)), []byte(`"`))
}

// sameField reports whether encoding/json could take a and b for the same
// field: equal under Unicode simple case folding (so "K" matches the
// Kelvin sign, as it does there).
func sameField(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	for i := 0; i < len(a); i++ {
		if a[i] >= utf8.RuneSelf {
			return bytes.EqualFold(a, b)
		}
	}
	for i := 0; i < len(b); i++ {
		if b[i] >= utf8.RuneSelf {
			return bytes.EqualFold(a, b)
		}
	}
	return len(a) == len(b) && bytes.EqualFold(a, b)
}

// twinsError says which members of the JSON document data name one field,
// or returns nil.
func twinsError(data []byte) error {
	path, a, b, ok := twinMembers(data)
	if !ok {
		return nil
	}
	if a == b {
		return fmt.Errorf("%q is given twice: readers disagree on which one counts (encoding/json, and so flanneld, takes the last): keep one", path+a)
	}
	return fmt.Errorf("%q and %q name one field (names match regardless of case): readers disagree on which one counts (encoding/json, and so flanneld, takes the last): keep one", path+a, path+b)
}
