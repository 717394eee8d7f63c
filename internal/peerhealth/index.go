package peerhealth

import "hash/maphash"

// peerIndex finds a peer's record by its key: a hash table of positions
// in the schedule's peers (open addressing, linear probing), the keys
// read from the records themselves. A slot is 4 bytes and the table is
// at most 3/4 full, so it costs 5 to 11 bytes a peer, where a Go map of
// keys to positions costs about 44 (each key held a second time, and
// the map's own overhead) and one of keys to pointers more.
type peerIndex struct {
	slots []int32 // a position in the peers + 1; 0: empty
	n     int     // slots in use
	seed  maphash.Seed
}

func newPeerIndex() peerIndex { return peerIndex{seed: maphash.MakeSeed()} }

// minSlots is the smallest table.
const minSlots = 8

// slot is where k is in x, or the empty slot where it would go (ok false);
// -1 for an empty table.
func (x *peerIndex) slot(peers []entry, k pkey) (i int, ok bool) {
	if len(x.slots) == 0 {
		return -1, false
	}
	mask := len(x.slots) - 1
	for i = x.home(k); ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return i, false
		}
		if peers[v-1].key == k {
			return i, true
		}
	}
}

// home is k's first slot.
func (x *peerIndex) home(k pkey) int {
	return int(maphash.Comparable(x.seed, k) & uint64(len(x.slots)-1))
}

// find is k's position in peers, -1 if it has none.
func (x *peerIndex) find(peers []entry, k pkey) int {
	i, ok := x.slot(peers, k)
	if !ok {
		return -1
	}
	return int(x.slots[i]) - 1
}

// insert records that k, not in x, is at position pos.
func (x *peerIndex) insert(peers []entry, k pkey, pos int) {
	x.reserve(peers, x.n+1)
	i, _ := x.slot(peers, k)
	x.slots[i] = int32(pos) + 1
	x.n++
}

// move records that k, in x, is now at position pos. peers must still
// hold k at its old position.
func (x *peerIndex) move(peers []entry, k pkey, pos int) {
	if i, ok := x.slot(peers, k); ok {
		x.slots[i] = int32(pos) + 1
	}
}

// delete forgets k. peers must still hold every key x has.
func (x *peerIndex) delete(peers []entry, k pkey) {
	i, ok := x.slot(peers, k)
	if !ok {
		return
	}
	// Close the gap: a key further along the run that may live at i (its
	// home is not cyclically within (i, j]) moves back into it, which
	// leaves a gap at j, until the run ends. No tombstones.
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; x.slots[j] != 0; j = (j + 1) & mask {
		h := x.home(peers[x.slots[j]-1].key)
		if (j-h)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = 0
	x.n--
}

// reserve makes room for n keys.
func (x *peerIndex) reserve(peers []entry, n int) {
	if n*4 <= len(x.slots)*3 {
		return
	}
	size := max(minSlots, len(x.slots))
	for n*4 > size*3 {
		size *= 2
	}
	old := x.slots
	x.slots = make([]int32, size)
	mask := size - 1
	for _, v := range old {
		if v == 0 {
			continue
		}
		i := x.home(peers[v-1].key)
		for x.slots[i] != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = v
	}
}
