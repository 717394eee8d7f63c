package journal

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

const (
	header = `{"journal":2,"prefix":"/coreos.com/network/subnets/","cluster":7}` + "\n"
	lease  = `L "10.244.1.0-24" 5 3 {"PublicIP":"198.18.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}}` + "\n"
)

// seal gives every R record of journal the checksum it must carry (what
// follows "R rev" is replaced), so that a test's hand-written journal is
// refused, or not, for what the test wrote.
func seal(journal string) string {
	var out []byte
	for line := range strings.Lines(journal) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "R" && strings.HasSuffix(line, "\n") {
			line = fmt.Sprintf("R %s %d\n", f[1], Checksum(0, out))
		}
		out = append(out, line...)
	}
	return string(out)
}

// The file is untrusted input: whatever it holds, reading it gives a
// clear error naming the line, or the set at its last whole batch.
func TestReplayRefusesDamagedFiles(t *testing.T) {
	for _, tc := range []struct{ name, file, err string }{
		{"empty", "", "header"},
		{"not json", "garbage\n", "header"},
		{"another format", `{"journal":1}` + "\n", "format 1, want 2"},
		{"no revision", header + lease, "no complete lease set"},
		{"only a header", strings.TrimSuffix(header, "\n"), "no complete lease set"},
		{"a lease without a value", seal(header + `L "10.244.1.0-24" 0 3` + "\nR 4\n"), "line 2: missing field"},
		{"an unquoted key", seal(header + "D 10.244.1.0-24\nR 4\n"), "line 2: want a quoted string"},
		{"garbage in the middle", seal(header + lease + "}{\nR 4\n"), "line 3: unknown record"},
		{"revision going back", seal(header + lease + "R 4\nR 2\n"), "revision 2 after 4"},
		{"revision 0", seal(header + lease + "R 0\n"), "line 3: revision 0"},
		{"negative revision", header + lease + "R -4 0\n", "non-negative"},
		{"no checksum", header + lease + "R 4\n", "line 3: missing field"},
		{"a checksum out of range", header + lease + "R 4 4294967296\n", "out of range"},
		{"a field too many", header + lease + "R 4 5 6\n", "unexpected"},
		{"an empty line", seal(header + lease + "\nR 4\n"), "line 3: empty line"},
		{"a lease changed after it was written", strings.Replace(seal(header+lease+"R 4\n"), "198.18.0.1", "198.18.0.2", 1), "line 3: checksum"},
		{"a line lost", strings.Replace(seal(header+lease+`D "10.244.1.0-24"`+"\nR 4\n"), lease, "", 1), "line 3: checksum"},
		{"a record of a later batch lost", strings.Replace(seal(header+lease+"R 4\n"+`D "10.244.1.0-24"`+"\nR 6\n"+lease+"R 8\n"), `D "10.244.1.0-24"`+"\n", "", 1), "line 4: checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Replay([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Replay = %+v, %v; want an error saying %q", r, err, tc.err)
			}
		})
	}
}

// Replay applies whole batches only: a batch a crash cut short is not part
// of the set, and End says where to cut the file and append.
func TestReplayStopsAtTheLastWholeBatch(t *testing.T) {
	whole := seal(header + lease + `I "10.244.2.0-24" 4 "bad"` + "\nR 4\nC\n" + `L "10.244.3.0-24" 0 5 {}` + "\nR 6\n")
	r, err := Replay([]byte(whole + `D "10.244.1.0-24"` + "\n" + `L "10.244.9.0-24" 0 7 {"Pub`))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range r.Keys {
		keys = append(keys, k)
	}
	if len(keys) != 2 || r.Keys["10.244.1.0-24"].Mod != 3 || r.Keys["10.244.3.0-24"].Mod != 5 {
		t.Errorf("keys %v; want 10.244.1.0-24 at 3 and 10.244.3.0-24 at 5 (the invalid key cleared, the cut-short batch not applied)", r.Keys)
	}
	if r.Rev != 6 || r.End != len(whole) || r.Records != 6 || r.Sum != Checksum(0, []byte(whole)) {
		t.Errorf("Rev %d, End %d, Records %d, Sum %d; want 6, %d, 6, %d", r.Rev, r.End, r.Records, r.Sum, len(whole), Checksum(0, []byte(whole)))
	}
}

// Whatever a file holds, reading it never panics, and a set it reads is
// written and read back unchanged.
func FuzzReplay(f *testing.F) {
	f.Add([]byte(header + lease + `I "10.244.2.0-24" 4 "bad"` + "\nR 4\nC\n" + `D "10.244.1.0-24"` + "\nR 6\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Sealed, or nearly every input would stop at its first checksum.
		r, err := Replay([]byte(seal(string(data))))
		if err != nil {
			return
		}
		recs := make([]Record, 0, len(r.Keys))
		for _, rec := range r.Keys {
			recs = append(recs, rec)
		}
		out, err := Encode(r.Header, recs, r.Rev)
		if err != nil {
			t.Fatalf("a set read does not encode: %v", err)
		}
		again, err := Replay(out)
		if err != nil {
			t.Fatalf("a written set does not read: %v\n%s", err, out)
		}
		if again.Header != r.Header || again.Rev != r.Rev || !reflect.DeepEqual(again.Keys, r.Keys) {
			t.Fatalf("written and read back:\n%+v\nwas\n%+v", again, r)
		}
	})
}
