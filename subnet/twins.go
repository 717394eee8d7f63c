package subnet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// twinMembers finds, in the JSON document data, the first object (at any
// depth) with two members naming one field: the same name twice, or names
// that differ only in case. encoding/json — and so flanneld — matches
// member names case-insensitively and keeps the last, while a reader that
// takes the exact name (or the first) reads the other one: such a document
// means two things, and is refused. It returns the path of the object
// (e.g. "Backend.") and the two names, or ok false (also for a document
// that is not JSON: its reader says why).
//
// Lease values reach it only when decodeAttrsFast could not read them (it
// reads no value with twins), so it walks the document with encoding/json's
// tokens rather than a scanner of its own.
func twinMembers(data []byte) (path, first, second string, ok bool) {
	if !json.Valid(data) {
		return "", "", "", false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func(path string) (string, string, string, bool)
	walk = func(path string) (string, string, string, bool) {
		tok, err := dec.Token()
		if err != nil {
			return "", "", "", false
		}
		switch tok {
		case json.Delim('{'):
			var names []string
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return "", "", "", false
				}
				name, _ := tok.(string)
				for _, n := range names {
					if strings.EqualFold(n, name) {
						return path, n, name, true
					}
				}
				names = append(names, name)
				if p, a, b, ok := walk(path + name + "."); ok {
					return p, a, b, ok
				}
			}
		case json.Delim('['):
			for dec.More() {
				if p, a, b, ok := walk(path); ok {
					return p, a, b, ok
				}
			}
		default:
			return "", "", "", false
		}
		_, _ = dec.Token() // the closing delimiter
		return "", "", "", false
	}
	return walk("")
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
