package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// A document with two members naming one field means one thing to
// encoding/json (and flanneld), which keeps the last, and another to a
// reader that takes the first: configs and lease values are refused,
// naming both.
func TestTwinMembersAreRefused(t *testing.T) {
	configs := map[string]string{
		`{"Network":"10.1.0.0/16","Network":"10.2.0.0/16"}`:                         `"Network" is given twice`,
		`{"Network":"10.1.0.0/16","network":"10.2.0.0/16"}`:                         `"Network" and "network" name one field`,
		`{"Network":"10.1.0.0/16","Backend":{"VNI":1,"vni":2}}`:                     `"Backend.VNI" and "Backend.vni" name one field`,
		`{"Network":"10.1.0.0/16","Backend":{"GBP":true,"gbp":false}}`:              `"Backend.GBP" and "Backend.gbp" name one field`,
		`{"Network":"10.1.0.0/16","EnableNFTables":true,"enablenftables":false}`:    `"EnableNFTables" and "enablenftables"`,
		`{"Network":"10.1.0.0/16","Net\u0077ork":"10.2.0.0/16"}`:                    `"Network" is given twice`,
		`{"Network":"10.1.0.0/16","Backend":{"Type":"vxlan","\u212aey":1,"key":2}}`: "\"Backend.\u212aey\" and \"Backend.key\"",
	}
	for doc, want := range configs {
		_, err := ParseConfig([]byte(doc))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "keep one") {
			t.Errorf("ParseConfig(%s) = %v, want an error with %q", doc, err, want)
		}
	}
	// As configuration.md quotes it.
	const documented = `invalid network config: "Network" and "network" name one field (names match regardless of case): readers disagree on which one counts (encoding/json, and so flanneld, takes the last): keep one`
	if _, err := ParseConfig([]byte(`{"Network":"10.1.0.0/16","network":"10.2.0.0/16"}`)); err == nil || err.Error() != documented {
		t.Errorf("ParseConfig of twins = %v, configuration.md quotes %s", err, documented)
	}
	values := map[string]string{
		`{"PublicIP":"198.18.0.1","PublicIP":"198.18.0.2"}`:                                      `"PublicIP" is given twice`,
		`{"PublicIP":"198.18.0.1","publicIP":"198.18.0.2"}`:                                      `"PublicIP" and "publicIP" name one field`,
		`{"PublicIP":"198.18.0.1","BackendData":{"VtepMAC":"0e:00:00:00:00:01","vtepmac":"x"}}`:  `"BackendData.VtepMAC" and "BackendData.vtepmac"`,
		`{"PublicIP":"198.18.0.1","NodeID":"a","nodeid":7}`:                                      `"NodeID" and "nodeid"`,
		`{"PublicIP":"198.18.0.1","BackendV6Data":{"VNI":1,"VNI":2},"PublicIPv6":"2001:db8::1"}`: `"BackendV6Data.VNI" is given twice`,
	}
	for value, want := range values {
		_, err := DecodeAttrs([]byte(value))
		if !errors.Is(err, ErrInvalidLease) || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeAttrs(%s) = %v, want an invalid lease naming %q", value, err, want)
		}
	}
	// Names alike only in part, and the same name in different objects, are
	// no twins.
	for _, value := range []string{
		`{"PublicIP":"198.18.0.1","PublicIPv6":"2001:db8::1","BackendData":{"VNI":1},"BackendV6Data":{"VNI":1}}`,
		`{"PublicIP":"198.18.0.1","x":[{"a":1},{"a":2}],"y":{"a":{"a":1}}}`,
		`{"PublicIP":"198.18.0.1","s":"\"PublicIP\":1"}`,
	} {
		if _, err := DecodeAttrs([]byte(value)); err != nil {
			t.Errorf("DecodeAttrs(%s) = %v", value, err)
		}
	}
}

// config get -w json renders what config put stores back: every member
// flanneld acts on, and any unknown one, survives the round trip with
// its value.
func TestConfigKeepsEveryMember(t *testing.T) {
	for _, doc := range []string{
		`{"Network":"10.1.0.0/16","EnableNFTables":true,"Custom":{"a":[1,2]},"Backend":{"Type":"vxlan","GBP":true,"MacPrefix":"0e:00","Learning":true}}`,
		`{"network":"10.1.0.0/16","EnableIPv6":false,"IPv6Network":"fd00::/48","IPv6SubnetLen":64,"backend":{"type":"vxlan","gbp":true}}`,
		`{"EnableIPv4":false,"Network":"10.1.0.0/16","SubnetLen":20,"EnableIPv6":true,"IPv6Network":"fd00::/48","Backend":null,"x":null}`,
	} {
		cfg, err := ParseConfig([]byte(doc))
		if err != nil {
			t.Fatalf("ParseConfig(%s): %v", doc, err)
		}
		out, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var in, got map[string]any
		if err := json.Unmarshal([]byte(doc), &in); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("rendered %s: %v", out, err)
		}
		for name, want := range in {
			v, ok := lookupFold(got, name)
			if sub, isObj := want.(map[string]any); isObj {
				for k, w := range sub {
					gv, _ := v.(map[string]any)
					if g, ok := lookupFold(gv, k); !ok || !reflect.DeepEqual(g, w) {
						t.Errorf("%s: member %s.%s = %v, rendered %s", doc, name, k, w, out)
					}
				}
				continue
			}
			if defaulted(name, want) {
				continue
			}
			if !ok || !reflect.DeepEqual(v, want) {
				t.Errorf("%s: member %s = %v lost or changed: rendered %s", doc, name, want, out)
			}
		}
		again, err := ParseConfig(out)
		if err != nil || !reflect.DeepEqual(again, cfg) {
			t.Errorf("rendered %s parses to %+v (%v), not %+v", out, again, err, cfg)
		}
	}
}

// defaulted reports whether a member given as name: value is its default,
// which a rendered config leaves out.
func defaulted(name string, value any) bool {
	return strings.EqualFold(name, "EnableIPv6") && value == false || strings.EqualFold(name, "EnableIPv4") && value == true ||
		strings.EqualFold(name, "Backend") && value == nil
}

func lookupFold(m map[string]any, name string) (any, bool) {
	for k, v := range m {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return nil, false
}

// anyTwins is twinMembers written the slow way: some object of the valid
// JSON document data has two members encoding/json would match to one
// field.
func anyTwins(data []byte) bool {
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case []any:
			return slices.ContainsFunc(v, walk)
		case rawObject:
			for i, m := range v {
				for _, n := range v[:i] {
					if strings.EqualFold(n.name, m.name) {
						return true
					}
				}
				if walk(m.value) {
					return true
				}
			}
		}
		return false
	}
	v, err := readOrdered(json.NewDecoder(bytes.NewReader(data)))
	return err == nil && walk(v)
}

type rawObject []struct {
	name  string
	value any
}

// readOrdered reads one JSON value keeping every object member, in order.
func readOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var obj rawObject
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, struct {
				name  string
				value any
			}{name.(string), v})
		}
		_, err = dec.Token()
		return obj, err
	case json.Delim('['):
		var arr []any
		for dec.More() {
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err = dec.Token()
		return arr, err
	}
	return tok, nil
}

// twinMembers agrees with anyTwins, and says nothing of a document that
// is not JSON.
func TestTwinMembersAgreesWithTheSlowWay(t *testing.T) {
	for _, s := range []string{`{"a":1,"A":2}`, `{"a":{"b":[{"c":1,"C":2}]}}`, `[{"\u212a":1,"k":2}]`, `{"s":"\"a\":1","a":2}`,
		`{"a\"b":1,"A\"B":1}`, `"x"`, `{}`, `{"a":1,"b":{"a":2}}`, `{"a":1,"A":`, `{"a":[1,{"x":1,"y":2}],"b":2}`} {
		_, a, b, got := twinMembers([]byte(s))
		if want := json.Valid([]byte(s)) && anyTwins([]byte(s)); got != want {
			t.Errorf("twinMembers(%s) = %v (%q, %q), want %v", s, got, a, b, want)
		}
	}
}
