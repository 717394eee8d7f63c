package subnet

import (
	"github.com/overlaynet/overlay/internal/lib/jsonobj"
)

// Every host decodes every lease value at every start (10,000 of them in a
// large cluster), and encoding/json, which reads them as flanneld does,
// was most of the daemon's own CPU time at a cold start (issue 33). Nearly
// every value has one plain shape: an object of strings without escapes
// and integers, with BackendData an object of those. decodeAttrsFast (and
// each backend's reader of its data, e.g. backend/vxlan's) read that shape
// directly (jsonobj.Plain) and give up on anything else (escapes,
// non-ASCII, null, arrays, floats, member names that match a field only
// case-insensitively), which then goes through encoding/json as before.
// What they accept, they decode exactly as encoding/json does
// (TestFastDecodingAgreesWithEncodingJSON).

var attrsFields = []string{"PublicIP", "PublicIPv6", "BackendType", "BackendData", "BackendV6Data", "NodeID", "Hostname"}

// decodeAttrsFast decodes a plain value (see above); false: decode it with
// encoding/json.
func decodeAttrsFast(value []byte) (LeaseAttrs, bool) {
	var a LeaseAttrs
	ok := jsonobj.Plain(value, 1, func(m jsonobj.Member) bool {
		var s *string
		switch string(m.Name) {
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
			a.BackendData = shared(m.Value)
			return m.Kind == 'o'
		case "BackendV6Data":
			a.BackendV6Data = shared(m.Value)
			return m.Kind == 'o'
		default:
			return !jsonobj.FoldsTo(m.Name, attrsFields...) // others are ignored
		}
		if string(m.Value) == DefaultBackendType {
			*s = DefaultBackendType // the same in every lease: not a copy each
		} else {
			*s = string(m.Value)
		}
		return m.Kind == 's'
	})
	return a, ok
}

// shared is b, a part of the value being decoded, capped at its length so
// that an append to it copies instead of writing over the rest of the
// value: the backend data shares the value's bytes (which the lease keeps
// anyway, Lease.Value) rather than being a copy of its own, one allocation
// less per lease at every start and relist.
func shared(b []byte) []byte { return b[:len(b):len(b)] }
