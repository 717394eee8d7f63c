// Package corrupt makes random corruptions of a value for tests that
// check a hand-written decoder against encoding/json on values near
// valid ones, where a fuzzer's random bytes rarely land.
package corrupt

import "math/rand/v2"

// Each calls f with n corruptions of v, each a copy with one to three
// bytes replaced by, or inserted from, alphabet, or deleted.
func Each(r *rand.Rand, v, alphabet []byte, n int, f func([]byte)) {
	for range n {
		c := append([]byte(nil), v...)
		for range 1 + r.IntN(3) {
			if len(c) == 0 {
				break
			}
			i := r.IntN(len(c))
			switch r.IntN(3) {
			case 0:
				c[i] = alphabet[r.IntN(len(alphabet))]
			case 1:
				c = append(c[:i], c[i+1:]...)
			default:
				c = append(c[:i], append([]byte{alphabet[r.IntN(len(alphabet))]}, c[i:]...)...)
			}
		}
		f(c)
	}
}
