package subnet

import "testing"

// Every host parses every lease key at every start: a canonical key
// (checked by spelling its address out again) costs no allocation.
func TestParseLeaseKeyAllocatesNothing(t *testing.T) {
	for _, key := range []string{"10.244.7.0-24", "10.244.7.0-24&fd00:10:244:7::-64"} {
		if n := testing.AllocsPerRun(100, func() {
			if _, err := ParseLeaseKey(key); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("ParseLeaseKey(%q): %.0f allocations, want 0", key, n)
		}
	}
}
