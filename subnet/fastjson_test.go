package subnet

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/corrupt"
)

var plainValues = []string{
	`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}}`,
	`{"PublicIP":"198.18.0.7","PublicIPv6":"2001:db8::7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:01:00:07"},"NodeID":"n7","Hostname":"h7"}`,
	" {\n \"PublicIP\" : \"198.18.0.7\" ,\t\"BackendData\" : { \"VtepMAC\" : \"x\" , \"VNI\" : -0 } , \"Zone\" : {\"a\":1} } ",
	`{"PublicIP":"a","PublicIP":"b","BackendData":{},"BackendData":{"VNI":2}}`,
	`{}`,
	`{"publicip":"198.18.0.7"}`,
	`{"PublicIP":"198.18.0.7","BackendData":null}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":1.0}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":01}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":99999999999999999999}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"vni":1,"VNI":2}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":"1"}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":1,"VtepMAC":7}}`,
	`{"PublicIP":"198.1\u0038.0.7"}`,
	`{"PublicIP":"198.18.0.7","Hostname":"h\u00e9"}`,
	"{\"PublicIP\":\"198.18.0.7\",\"Hostname\":\"h\xc3\xa9\"}",
	"{\"PublicIP\":\"198.18.0.7\",\"Hostname\":\"h\xff\"}",
	`{"PublicIP":7}`,
	`{"PublicIP":"198.18.0.7",}`,
	`{"PublicIP":"198.18.0.7"} x`,
	`{"PublicIP":"198.18.0.7","Tags":["a"],"On":true,"Off":null}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":1,"Extra":{"Deep":1}}}`,
	`{"PublicIP":"198.18.0.7","BackendData":{"VNI":-9223372036854775808}}`,
}

// What the fast path accepts, it decodes as encoding/json does; what it
// does not, DecodeAttrs hands to encoding/json. Checked on a table of
// plain and tricky values and on random corruptions of them.
func TestFastDecodingAgreesWithEncodingJSON(t *testing.T) {
	check := func(v []byte) { fastAgrees(t, v) }
	r := rand.New(rand.NewPCG(33, 1))
	alphabet := []byte("{}[]\":,0123456789-.eE \\\nabcPIVNx\x00\xff")
	for _, s := range plainValues {
		check([]byte(s))
		corrupt.Each(r, []byte(s), alphabet, 3000, check)
	}
	if _, ok := decodeAttrsFast([]byte(plainValues[1])); !ok {
		t.Error("the fast path refuses a plain dual-stack value")
	}
}

// (The allocations of decoding a plain lease value, with its backend
// data, are counted in backend/vxlan: TestPlainLeaseValueDecodesCheaply.)

// fastAgrees fails t if the fast decoder accepts v and decodes it
// otherwise than encoding/json.
func fastAgrees(t *testing.T, v []byte) {
	t.Helper()
	if got, ok := decodeAttrsFast(v); ok {
		if anyTwins(v) {
			t.Errorf("fast path accepts %q, which has twin members", v)
		}
		var want LeaseAttrs
		if err := json.Unmarshal(v, &want); err != nil {
			t.Errorf("fast path accepts %q, which encoding/json refuses: %v", v, err)
		} else if !reflect.DeepEqual(got, want) {
			t.Errorf("fast path decodes %q as %+v, encoding/json as %+v", v, got, want)
		}
	}
	// The backend's data is read by its codec, and checked with it
	// (backend/vxlan: TestFastDecodingAgreesWithEncodingJSON).
}

// FuzzFastDecodingAgreesWithEncodingJSON: arbitrary bytes, the same check.
func FuzzFastDecodingAgreesWithEncodingJSON(f *testing.F) {
	for _, v := range plainValues {
		f.Add([]byte(v))
	}
	for _, v := range []string{`{"PublicIP":"198.18.0.1","publicip":"198.18.0.2"}`, `{"NodeID":"a","NodeID":"b"}`,
		`{"PublicIP":"198.18.0.1","BackendData":{"VtepMAC":"0e:00:00:00:00:01","vtepmac":"0e:00:00:00:00:02"}}`} {
		f.Add([]byte(v))
	}
	f.Fuzz(fastAgrees)
}

// The backend data of a plain value shares the value's bytes, capped: an
// append to it copies, and leaves the value (which the lease keeps) as read.
func TestBackendDataSharesTheValueButAnAppendCopies(t *testing.T) {
	v := []byte(`{"PublicIP":"198.18.0.7","BackendData":{"VNI":1},"Hostname":"h"}`)
	orig := string(v)
	a, err := DecodeAttrs(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.BackendData) != `{"VNI":1}` || &a.BackendData[0] != &v[bytes.Index(v, []byte(`{"VNI"`))] {
		t.Fatalf("BackendData %q is not the value's own bytes", a.BackendData)
	}
	_ = append(a.BackendData, "XXXXXXXXXXXX"...)
	if string(v) != orig {
		t.Errorf("an append to BackendData wrote over the value: %q", v)
	}
}
