package subnet

import (
	"bytes"
	"strconv"
)

// Every host decodes every lease value at every start (10,000 of them in a
// large cluster), and encoding/json, which reads them as flanneld does,
// was most of the daemon's own CPU time at a cold start (issue 33). Nearly
// every value has one plain shape: an object of strings without escapes
// and integers, with BackendData an object of those. decodeAttrsFast and
// decodeVXLANFast read that shape directly and give up on anything else
// (escapes, non-ASCII, null, arrays, floats, plainMember names that match a
// field only case-insensitively), which then goes through encoding/json as
// before. What they accept, they decode exactly as encoding/json does
// (TestFastDecodingAgreesWithEncodingJSON).

// plainMember is one member of an object read by plainObject: kind 's' for a
// string (value without its quotes), 'n' an integer, 'o' an object (value
// with its braces, as it was written).
type plainMember struct {
	name, value []byte
	kind        byte
}

// plainObject calls visit with each member of data, a JSON object of
// strings without escapes or non-ASCII bytes, integers, and (nest > 0)
// objects of the same nest-1 deep. It returns false, having stopped, when
// data is anything else or visit returns false.
func plainObject(data []byte, nest int, visit func(plainMember) bool) bool {
	end, ok := scanObject(data, skipSpace(data, 0), nest, visit)
	return ok && skipSpace(data, end) == len(data)
}

func scanObject(d []byte, i, nest int, visit func(plainMember) bool) (int, bool) {
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
		m := plainMember{name: d[i+1 : nameEnd-1]}
		if seen == len(names) {
			return 0, false
		}
		for _, n := range names[:seen] {
			if bytes.EqualFold(n, m.name) {
				return 0, false
			}
		}
		names[seen] = m.name
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
			m.kind = 's'
			if end, ok = scanString(d, i); ok {
				m.value = d[start+1 : end-1]
			}
		case c == '-' || c >= '0' && c <= '9':
			m.kind = 'n'
			if end, ok = scanInteger(d, i); ok {
				m.value = d[start:end]
			}
		case c == '{' && nest > 0:
			m.kind = 'o'
			if end, ok = scanObject(d, i, nest-1, func(plainMember) bool { return true }); ok {
				m.value = d[start:end]
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

// foldsTo reports whether name matches one of fields case-insensitively,
// as encoding/json would match it, without being spelt exactly like it.
func foldsTo(name []byte, fields ...string) bool {
	for _, f := range fields {
		if bytes.EqualFold(name, []byte(f)) {
			return true
		}
	}
	return false
}

var attrsFields = []string{"PublicIP", "PublicIPv6", "BackendType", "BackendData", "BackendV6Data", "NodeID", "Hostname"}

// decodeAttrsFast decodes a plain value (see above); false: decode it with
// encoding/json.
func decodeAttrsFast(value []byte) (LeaseAttrs, bool) {
	var a LeaseAttrs
	ok := plainObject(value, 1, func(m plainMember) bool {
		var s *string
		switch string(m.name) {
		case "PublicIP":
			s = &a.PublicIP
		case "PublicIPv6":
			s = &a.PublicIPv6
		case "BackendType":
			s = &a.BackendType
		case "NodeID":
			s = &a.NodeID
		case "Hostname":
			s = &a.Hostname
		case "BackendData":
			a.BackendData = append(a.BackendData[:0], m.value...)
			return m.kind == 'o'
		case "BackendV6Data":
			a.BackendV6Data = append(a.BackendV6Data[:0], m.value...)
			return m.kind == 'o'
		default:
			return !foldsTo(m.name, attrsFields...) // others are ignored
		}
		if string(m.value) == DefaultBackendType {
			*s = DefaultBackendType // the same in every lease: not a copy each
		} else {
			*s = string(m.value)
		}
		return m.kind == 's'
	})
	return a, ok
}

// decodeVXLANFast decodes plain backend data; false: decode it with
// encoding/json.
func decodeVXLANFast(raw []byte) (VXLANData, bool) {
	var d VXLANData
	ok := plainObject(raw, 0, func(m plainMember) bool {
		switch string(m.name) {
		case "VNI":
			if m.kind != 'n' {
				return false
			}
			n, err := strconv.Atoi(string(m.value))
			d.VNI = n
			return err == nil
		case "VtepMAC":
			d.VtepMAC = string(m.value)
			return m.kind == 's'
		}
		return !foldsTo(m.name, "VNI", "VtepMAC")
	})
	return d, ok
}
