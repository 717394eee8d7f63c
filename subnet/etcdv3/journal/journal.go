// Package journal is the file format of the lease journal (etcdv3.Journal):
// a JSON header line, then one record per line. Keys and messages are
// Go-quoted; a lease's value is its JSON as etcd holds it (compact: it never
// spans lines):
//
//	{"journal":2,"prefix":"/coreos.com/network/subnets/","cluster":1234}
//	L "10.244.1.0-24" 7587 12 {"PublicIP":...}   a lease: key, etcd lease, ModRevision, value
//	I "10.244.9.0-24" 13 "invalid character..."  a key whose value does not decode
//	D "10.244.1.0-24"                            a key deleted
//	C                                            a re-list follows: forget the invalid keys
//	R 14 3905627101                              what precedes is the lease set at revision 14
//
// An R record ends with the CRC-32C of every byte of the file before it, so
// a file changed after it was written (a bit flipped, a line lost) is
// refused rather than resumed from. What follows the last R record is a
// write cut short, not part of the set.
//
// The package only reads and writes bytes: what the values mean, and the
// file itself, are etcdv3's.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Version is the format written in the header. Version 1 had no checksums.
const Version = 2

// Header is the file's first line.
type Header struct {
	Journal int    `json:"journal"`
	Prefix  string `json:"prefix"`
	Cluster uint64 `json:"cluster"`
}

// Kind is a record's kind: the first byte of its line.
type Kind byte

const (
	KindLease   Kind = 'L'
	KindInvalid Kind = 'I'
	KindGone    Kind = 'D'
	KindClear   Kind = 'C'
	KindRev     Kind = 'R'
)

// Record is one line.
type Record struct {
	Kind            Kind
	Key             string // relative to the header's prefix
	Value           []byte // a lease's value
	Lease, Mod, Rev int64  // a lease's etcd lease, a key's ModRevision, an R record's revision
	Err             string // why an invalid key's value does not decode
	Sum             uint32 // an R record's checksum of the file before it
}

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum extends sum, the checksum of a file's bytes so far, by p.
func Checksum(sum uint32, p []byte) uint32 { return crc32.Update(sum, table, p) }

// Seal returns the R record that ends a batch at revision rev, for a file
// whose bytes before it (the batch included) have checksum sum.
func Seal(rev int64, sum uint32) Record { return Record{Kind: KindRev, Rev: rev, Sum: sum} }

// Encode is a whole file: the header, recs (sorted by key, in place) and
// the R record of revision rev.
func Encode(h Header, recs []Record, rev int64) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := EncodeTo(&buf, h, recs, rev); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EncodeTo writes what Encode returns to w, a line at a time (a file of
// 10,000 leases is 2 MB, which need not be in memory at once), and returns
// the checksum of what it wrote.
func EncodeTo(w io.Writer, h Header, recs []Record, rev int64) (uint32, error) {
	slices.SortFunc(recs, func(a, b Record) int { return strings.Compare(a.Key, b.Key) })
	return EncodeSorted(w, h, len(recs), func(i int) (Record, error) { return recs[i], nil }, rev)
}

// ErrUnsorted is EncodeSorted's error for records out of key order.
var ErrUnsorted = errors.New("records out of key order")

// EncodeSorted is EncodeTo for n records that rec makes one at a time, in
// key order, so that they need not all be in memory at once. It fails with
// ErrUnsorted, having written part of a file, if they are not in order.
func EncodeSorted(w io.Writer, h Header, n int, rec func(i int) (Record, error), rev int64) (uint32, error) {
	line, err := json.Marshal(h)
	if err != nil {
		return 0, err
	}
	line = append(line, '\n')
	bw := bufio.NewWriterSize(w, 64<<10)
	var sum uint32
	put := func(line []byte) {
		sum = Checksum(sum, line)
		_, _ = bw.Write(line) // the first error sticks; Flush returns it
	}
	put(line)
	last := ""
	for i := range n {
		r, err := rec(i)
		if err != nil {
			return 0, err
		}
		if i > 0 && r.Key < last {
			return 0, fmt.Errorf("%w: %q after %q", ErrUnsorted, r.Key, last)
		}
		last = r.Key
		line = r.Append(line[:0]) // one buffer for every line
		put(line)
	}
	put(Seal(rev, sum).Append(line[:0]))
	return sum, bw.Flush()
}

// Append appends r's line to buf.
func (r Record) Append(buf []byte) []byte {
	buf = append(buf, byte(r.Kind))
	switch r.Kind {
	case KindLease:
		buf = strconv.AppendQuote(append(buf, ' '), r.Key)
		buf = strconv.AppendInt(append(buf, ' '), r.Lease, 10)
		buf = strconv.AppendInt(append(buf, ' '), r.Mod, 10)
		buf = append(append(buf, ' '), r.Value...)
	case KindInvalid:
		buf = strconv.AppendQuote(append(buf, ' '), r.Key)
		buf = strconv.AppendInt(append(buf, ' '), r.Mod, 10)
		buf = strconv.AppendQuote(append(buf, ' '), r.Err)
	case KindGone:
		buf = strconv.AppendQuote(append(buf, ' '), r.Key)
	case KindRev:
		buf = strconv.AppendInt(append(buf, ' '), r.Rev, 10)
		buf = strconv.AppendUint(append(buf, ' '), uint64(r.Sum), 10)
	}
	return append(buf, '\n')
}

// parse reads one line (without its newline).
func parse(line string) (Record, error) {
	if line == "" {
		return Record{}, errors.New("empty line")
	}
	r := Record{Kind: Kind(line[0])}
	f := fields{s: line[1:]}
	switch r.Kind {
	case KindLease:
		r.Key, r.Lease, r.Mod = f.quoted(), f.count(), f.count()
		r.Value = []byte(f.rest())
	case KindInvalid:
		r.Key, r.Mod, r.Err = f.quoted(), f.count(), f.quoted()
	case KindGone:
		r.Key = f.quoted()
	case KindClear:
	case KindRev:
		if r.Rev = f.count(); f.err == nil && r.Rev == 0 {
			f.err = errors.New("revision 0")
		}
		if sum := f.count(); f.err == nil && sum > math.MaxUint32 {
			f.err = fmt.Errorf("checksum %d out of range", sum)
		} else {
			r.Sum = uint32(sum)
		}
	default:
		return r, fmt.Errorf("unknown record %q", line[:1])
	}
	if f.err == nil && f.s != "" {
		f.err = fmt.Errorf("unexpected %.20q", f.s)
	}
	return r, f.err
}

// fields reads the space-separated fields of a record; the first error
// sticks.
type fields struct {
	s   string
	err error
}

func (f *fields) next() bool {
	if f.err == nil && !strings.HasPrefix(f.s, " ") {
		f.err = errors.New("missing field")
	}
	if f.err != nil {
		return false
	}
	f.s = f.s[1:]
	return true
}

func (f *fields) quoted() string {
	if !f.next() {
		return ""
	}
	q, err := strconv.QuotedPrefix(f.s)
	if err != nil || q[0] != '"' {
		f.err = fmt.Errorf("want a quoted string at %.20q", f.s)
		return ""
	}
	f.s = f.s[len(q):]
	s, _ := strconv.Unquote(q)
	return s
}

// count is a non-negative integer.
func (f *fields) count() int64 {
	if !f.next() {
		return 0
	}
	end := strings.IndexByte(f.s, ' ')
	if end < 0 {
		end = len(f.s)
	}
	n, err := strconv.ParseInt(f.s[:end], 10, 64)
	if err != nil || n < 0 {
		f.err = fmt.Errorf("want a non-negative integer, not %.20q", f.s[:end])
		return 0
	}
	f.s = f.s[end:]
	return n
}

func (f *fields) rest() string {
	if !f.next() {
		return ""
	}
	s := f.s
	f.s = ""
	return s
}

// Replayed is what a file holds at its last R record.
type Replayed struct {
	Header Header
	// Keys are the lease and invalid records by key.
	Keys map[string]Record
	Rev  int64
	// End is the length of the file up to the last R record, and Records
	// how many records follow the header up to there; Sum is the
	// checksum of those End bytes.
	End, Records int
	Sum          uint32
}

// Replay reads a file's header and the keys it holds at its last R
// record. Lines after that record are not part of a whole batch; the last
// line is cut short if it does not end in a newline. Errors name the line.
func Replay(data []byte) (Replayed, error) {
	var r Replayed
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if err := json.Unmarshal(first, &r.Header); err != nil {
		return r, fmt.Errorf("header: %w", err)
	}
	if r.Header.Journal != Version {
		return r, fmt.Errorf("format %d, want %d", r.Header.Journal, Version)
	}
	r.Keys = map[string]Record{}
	offset := min(len(first)+1, len(data))
	sum := Checksum(0, data[:offset])
	var pending []Record
	for n := 2; ; n++ {
		line, next, complete := bytes.Cut(rest, []byte("\n"))
		if !complete {
			break
		}
		whole := rest[:len(line)+1]
		offset += len(whole)
		rest = next
		rec, err := parse(string(line))
		if err != nil {
			return r, fmt.Errorf("line %d: %w", n, err)
		}
		if rec.Kind != KindRev {
			pending = append(pending, rec)
			sum = Checksum(sum, whole)
			continue
		}
		if rec.Sum != sum {
			return r, fmt.Errorf("line %d: checksum %d, want %d: the file was changed after it was written", n, rec.Sum, sum)
		}
		if rec.Rev < r.Rev {
			return r, fmt.Errorf("line %d: revision %d after %d", n, rec.Rev, r.Rev)
		}
		for _, p := range pending {
			r.Apply(p)
		}
		sum = Checksum(sum, whole)
		r.Records += len(pending) + 1
		pending, r.Rev, r.End, r.Sum = pending[:0], rec.Rev, offset, sum
	}
	if r.Rev == 0 {
		return r, errors.New("holds no complete lease set")
	}
	return r, nil
}

// Apply applies rec to the keys, as replaying it does.
func (r *Replayed) Apply(rec Record) {
	switch rec.Kind {
	case KindClear:
		for k, v := range r.Keys {
			if v.Kind == KindInvalid {
				delete(r.Keys, k)
			}
		}
	case KindGone:
		delete(r.Keys, rec.Key)
	default:
		r.Keys[rec.Key] = rec
	}
}
