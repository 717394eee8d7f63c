package leasedata

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/testing/corrupt"
	"github.com/overlaynet/overlay/subnet"
)

// The VXLAN backend's part of a lease value, as flanneld writes it: the
// bytes of a lease other hosts (and flanneld) read.
func TestLeaseDataIsFlannels(t *testing.T) {
	mac, _ := net.ParseMAC("0e:2a:5f:00:11:22")
	if got, want := string(Codec{VNI: 1}.Encode(mac)), `{"VNI":1,"VtepMAC":"0e:2a:5f:00:11:22"}`; got != want {
		t.Errorf("Encode = %s, want %s", got, want)
	}
	a := subnet.NewAttrs(netip.MustParseAddr("198.18.0.7"), subnet.DefaultBackendType, Codec{VNI: 1}.Encode(mac), "node-a", "host-a").
		WithIPv6(netip.MustParseAddr("2001:db8::7"), Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 6, 7}))
	b, err := a.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"PublicIP":"198.18.0.7","PublicIPv6":"2001:db8::7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:2a:5f:00:11:22"},` +
		`"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"},"NodeID":"node-a","Hostname":"host-a"}`
	if string(b) != want {
		t.Errorf("lease value\n got %s\nwant %s", b, want)
	}
}

// Decode: a usable peer's data, or an error naming what is wrong; a VNI
// not the network's is a misfit (the lease is orphaned), apart from the
// errors that make the data unusable.
func TestDecodeNamesWhatIsWrong(t *testing.T) {
	c := Codec{VNI: 1}
	for _, tt := range []struct {
		raw, misfit, err string
	}{
		{raw: `{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`},
		{raw: `{"VNI":1,"VtepMAC":"0E:00:00:00:00:07"}`},
		{raw: `{"VtepMAC":"0e-00-00-00-00-07"}`},
		{raw: ` { "vtepmac" : "0e:00:00:00:00:07" , "vni" : 1 } `},
		{raw: `{"VNI":2,"VtepMAC":"0e:00:00:00:00:07"}`, misfit: "VNI 2 is not the network's Backend.VNI 1"},
		{raw: `{"VNI":2,"VtepMAC":"zz"}`, misfit: "VNI 2 is not the network's Backend.VNI 1", err: `VtepMAC "zz" is not a 6-byte MAC address`},
		{raw: ``, err: "BackendData is missing"},
		{raw: `null`, err: "BackendData is missing"},
		{raw: `"x"`, err: `"BackendData": want a JSON object, got "x"`},
		{raw: `{"VNI":"1"}`, err: `"BackendData.VNI": want a whole number, got "1"`},
		{raw: `{"VNI":1,"VtepMAC":7}`, err: `"BackendData.VtepMAC": want a string such as "0e:00:00:00:00:07", got 7`},
		{raw: `{"VNI":1,"VtepMAC":"00:00:00:00:00:00"}`, err: "VtepMAC is all zeros"},
		{raw: `{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}`, err: "VtepMAC 01:00:5e:00:00:01 is a multicast address"},
		{raw: `{"VNI":1,"VtepMAC":"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"}`, err: "is not a 6-byte MAC address"},
		{raw: `{"VNI":1,"vni":"x","VtepMAC":"0e:00:00:00:00:07"}`, err: `"BackendData": members that differ only in case, one of them not of its type`},
	} {
		data, misfit, err := c.Decode("BackendData", json.RawMessage(tt.raw))
		if got := errText(misfit); got != tt.misfit {
			t.Errorf("Decode(%s): misfit %q, want %q", tt.raw, got, tt.misfit)
		}
		if got := errText(err); tt.err == "" && got != "" || !strings.Contains(got, tt.err) || strings.Contains(got, "Go ") {
			t.Errorf("Decode(%s): error %q, want %q", tt.raw, got, tt.err)
		}
		if err == nil && PeerMAC(backend.Peer{Data: data}) != (MAC{0x0e, 0, 0, 0, 0, 7}) {
			t.Errorf("Decode(%s) = %v, want 0e:00:00:00:00:07", tt.raw, PeerMAC(backend.Peer{Data: data}))
		}
		if m2, e2 := c.CheckData("BackendData", json.RawMessage(tt.raw)); errText(m2) != errText(misfit) || errText(e2) != errText(err) {
			t.Errorf("CheckData(%s) = %v, %v; Decode said %v, %v", tt.raw, m2, e2, misfit, err)
		}
	}
	if _, _, err := c.Decode("BackendV6Data", nil); errText(err) != "BackendV6Data is missing" {
		t.Errorf("Decode(BackendV6Data, nil) = %v", err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A plain lease value, the one in nearly every lease, is decoded without
// encoding/json's reflection, and its data without a string made of the
// MAC: the allocations are the value's own fields.
func TestPlainLeaseValueDecodesCheaply(t *testing.T) {
	v := []byte(plainData[0])
	c := Codec{VNI: 1}
	n := testing.AllocsPerRun(100, func() {
		a, err := subnet.DecodeAttrs(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Decode("BackendData", a.BackendData); err != nil {
			t.Fatal(err)
		}
	})
	// PublicIP only: not the attributes themselves, nor BackendData
	// (it shares the value's bytes), nor BackendType ("vxlan" in every
	// lease), nor anything of the data.
	if n > 1 {
		t.Errorf("decoding a plain lease value: %.0f allocations, want at most 1", n)
	}
}

var plainData = []string{
	`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}}`,
	`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`,
	` { "VtepMAC" : "x" , "VNI" : -0 } `,
	`{}`,
	`{"VNI":1.0}`,
	`{"VNI":01}`,
	`{"VNI":99999999999999999999}`,
	`{"vni":1,"VNI":2}`,
	`{"VNI":"1"}`,
	`{"VNI":1,"VtepMAC":7}`,
	`{"VNI":1,"Extra":{"Deep":1}}`,
	`{"VNI":-9223372036854775808}`,
	`{"VtepMAC":"0e:00:00:00:00:01","vtepmac":"0e:00:00:00:00:02"}`,
	`{"VNI":1,"VtepMAC":"0E:0a:Bb:00:00:07"}`,
}

// What the fast readers accept, they decode as encoding/json does, and
// Decode's plain path reads the MAC as ParseVtepMAC does. Checked on a
// table of plain and tricky values and on random corruptions of them.
func TestFastDecodingAgreesWithEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 2))
	alphabet := []byte("{}[]\":,0123456789-.eE \\\nabcdefVNIx\x00\xff")
	for _, s := range plainData {
		fastAgrees(t, []byte(s))
		corrupt.Each(r, []byte(s), alphabet, 3000, func(v []byte) { fastAgrees(t, v) })
	}
	if _, ok := decodeFast([]byte(plainData[1])); !ok {
		t.Error("the fast path refuses plain backend data")
	}
	if _, _, ok := decodePlainMAC([]byte(plainData[1])); !ok {
		t.Error("the plain MAC path refuses plain backend data")
	}
}

// fastAgrees fails t if a fast reader accepts raw and reads it otherwise
// than encoding/json and ParseVtepMAC.
func fastAgrees(t *testing.T, raw []byte) {
	t.Helper()
	var want LeaseData
	werr := json.Unmarshal(raw, &want)
	if got, ok := decodeFast(raw); ok {
		if werr != nil {
			t.Errorf("fast path accepts backend data %q, which encoding/json refuses: %v", raw, werr)
		} else if got != want {
			t.Errorf("fast path decodes backend data %q as %+v, encoding/json as %+v", raw, got, want)
		}
	}
	if mac, vni, ok := decodePlainMAC(raw); ok {
		wantMAC, err := ParseVtepMAC(want.VtepMAC)
		if werr != nil || err != nil || mac != wantMAC || vni != want.VNI {
			t.Errorf("plain MAC path reads %q as %v VNI %d; encoding/json as %+v (%v), ParseVtepMAC %v (%v)", raw, mac, vni, want, werr, wantMAC, err)
		}
	}
}

// FuzzLeaseDataFastAgreesWithEncodingJSON: arbitrary bytes, the same check.
func FuzzLeaseDataFastAgreesWithEncodingJSON(f *testing.F) {
	for _, v := range plainData {
		f.Add([]byte(v))
	}
	f.Fuzz(fastAgrees)
}

// DecodeLeaseData reads data in one pass of encoding/json (or the fast
// path), and member by member (for its error messages) only when that
// fails: both must read all data alike, except where members differ only
// in case — there the one pass reads the last, as flanneld does. Errors
// speak JSON, not Go.
func FuzzLeaseDataReadsAsMemberByMember(f *testing.F) {
	for _, v := range plainData {
		f.Add([]byte(v))
	}
	f.Add([]byte(` { "vni" : 1.0 , "VtepMAC" : null } `))
	f.Add([]byte(`"x"`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := DecodeLeaseData("BackendData", raw)
		if err != nil && strings.Contains(err.Error(), "Go ") {
			t.Fatalf("error speaks Go, not JSON: %v", err)
		}
		if trimmed := bytes.TrimSpace(raw); len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) || caseTwins(raw) {
			return // missing: no second reading; twins: read two ways
		}
		want, wantErr := byMember("BackendData", raw)
		if (err == nil) != (wantErr == nil) || d != want {
			t.Fatalf("DecodeLeaseData = %+v, %v; member by member %+v, %v", d, err, want, wantErr)
		}
	})
}

// caseTwins reports whether the JSON object value has members whose names
// differ only in case (or repeat).
func caseTwins(value []byte) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(value, &members) != nil {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	if _, err := dec.Token(); err != nil {
		return false
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		for _, n := range names {
			if strings.EqualFold(n, tok.(string)) { // as encoding/json matches names
				return true
			}
		}
		names = append(names, tok.(string))
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}

// ParseVtepMAC refuses what is no VTEP's MAC, and says which rule.
func TestParseVtepMAC(t *testing.T) {
	if m, err := ParseVtepMAC("0e:00:00:00:00:07"); err != nil || m != (MAC{0x0e, 0, 0, 0, 0, 7}) {
		t.Errorf("ParseVtepMAC(good) = %v, %v", m, err)
	}
	for s, want := range map[string]string{"zz": "not a 6-byte", "00:00:00:00:00:00": "all zeros", "01:00:5e:00:00:01": "multicast",
		"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01": "not a 6-byte", "": "not a 6-byte"} {
		if _, err := ParseVtepMAC(s); err == nil || !strings.Contains(err.Error(), want) || errors.Unwrap(err) != nil {
			t.Errorf("ParseVtepMAC(%q) = %v, want a plain error with %q", s, err, want)
		}
	}
}
