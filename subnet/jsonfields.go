package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// field binds a JSON member to where its value goes. dst is a *string,
// *int, **int, *bool or *json.RawMessage; want says, in the user's words,
// what the value must be.
type field struct {
	name string
	dst  any
	want string
	// sub, if set, decodes a nested object instead of dst, given the
	// path of its members (e.g. "Backend.").
	sub func(path string, raw json.RawMessage) error
}

// decodeObject decodes the JSON object data into fields, matching member
// names case-insensitively as encoding/json (and so flannel) does; other
// members are ignored and null is the same as absent. Errors name the
// member as written in the document, prefixed by path (e.g. "Backend."),
// say what it must be and quote what it is — never a Go type.
func decodeObject(path string, data []byte, fields []field) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return syntaxError(path, data, err)
	}
	if members == nil { // the whole value was null
		return fmt.Errorf("%swant a JSON object, got null", quotePath(path))
	}
	for _, f := range fields {
		key, raw, ok := member(members, f.name)
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		if f.sub != nil {
			if err := f.sub(path+key+".", raw); err != nil {
				return err
			}
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return fmt.Errorf("%q: want %s, got %s", path+key, f.want, excerpt(raw))
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

// syntaxError explains why data is not a JSON object.
func syntaxError(path string, data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := position(data, syn.Offset)
		return fmt.Errorf("%snot valid JSON at line %d, column %d: %s", quotePath(path), line, col, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%snot valid JSON: it ends early (an object, array or string is not closed)", quotePath(path))
	case errors.As(err, &typ):
		return fmt.Errorf("%swant a JSON object, got %s", quotePath(path), excerpt(data))
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

// position turns the offset json reports (the bytes read when the error
// was found) into the 1-based line and column of the last byte read.
func position(data []byte, offset int64) (line, col int) {
	offset = max(1, min(offset, int64(len(data))))
	before := data[:offset-1]
	return bytes.Count(before, []byte("\n")) + 1, len(before) - bytes.LastIndexByte(before, '\n')
}

// excerpt quotes a JSON value as written, shortened to stay one line.
func excerpt(raw []byte) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	if s == "" {
		return "nothing"
	}
	return s
}
