package etcdv3

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/subnet"
)

// The lease journal keeps the lease set a host follows, with the revision
// it is current to, in a local file (beside subnet.env), so that a
// restarted overlayd resumes its watch from there instead of listing every
// lease: when a whole fleet restarts at once, N hosts each reading N leases
// is what keeps etcd busy (Documentation/scale.md).
//
// The file is a JSON header line, then one record per line, appended as
// the watch delivers batches; keys and messages are Go-quoted, a lease's
// value is its JSON as etcd holds it (compact: it never spans lines):
//
//	{"journal":2,"prefix":"/coreos.com/network/subnets/","cluster":1234}
//	L "10.244.1.0-24" 7587 12 {"PublicIP":...}   a lease: key, etcd lease, ModRevision, value
//	I "10.244.9.0-24" 13 "invalid character..."  a key whose value does not decode
//	D "10.244.1.0-24"                            a key deleted
//	C                                            a re-list follows: forget the invalid keys
//	R 14 3905627101                              what precedes is the lease set at revision 14
//
// An R record ends with the CRC-32C of every byte of the file before it,
// so a file changed after it was written (a bit flipped, a line lost) is
// refused rather than resumed from: Manager.AcquireFrom checks only this
// host's own key against etcd, as a count of every key would cost etcd a
// walk over all of them per restart. What follows the last R record (a
// write cut short) is cut off when the file is opened. Once the records
// outnumber twice the keys, the file is rewritten with one record per key,
// to a new name and renamed, so it is always whole. Appending costs a host
// what changed, not the size of the lease set, and keeps no lease value in
// memory; reading it back costs little more than decoding the values,
// which have to be decoded anyway.
//
// The file is untrusted input like etcd's values: each lease in it goes
// through the decoding every lease from etcd goes through, and
// Manager.AcquireFrom checks it against etcd before using it.

// journalVersion is the format written in the header. Version 1 had no
// checksums; a host that finds one lists every lease once.
const journalVersion = 2

// journalCRC is the checksum of R records: CRC-32C.
var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// maxJournalSize bounds what OpenJournal reads: 65,536 leases take about
// 20 MB written compactly.
const maxJournalSize = 256 << 20

// journalSlack is how many records a journal may gain beyond twice its
// keys before it is rewritten.
const journalSlack = 1024

// Record kinds: the first byte of a line.
const (
	recLease   = 'L'
	recInvalid = 'I'
	recGone    = 'D'
	recClear   = 'C'
	recRev     = 'R'
)

type journalHeader struct {
	Journal int    `json:"journal"`
	Prefix  string `json:"prefix"`
	Cluster uint64 `json:"cluster"`
}

type journalRecord struct {
	kind            byte
	key             string // relative to the header's prefix
	value           []byte // a lease's value
	lease, mod, rev int64
	err             string // why an invalid key's value does not decode
	sum             uint32 // an R record's checksum of the file before it
}

// JournalFile is where overlayd keeps the lease journal: beside the subnet
// file, e.g. /run/flannel/subnet.env.leases.
func JournalFile(subnetFile string) string { return subnetFile + ".leases" }

// Journal appends the batches of a watch to a lease journal file. It is
// not safe for concurrent use.
type Journal struct {
	path   string
	header journalHeader
	f      *os.File
	// keys is how many keys the file held when last written whole;
	// records how many records it has gained since.
	keys, records int
	rev           int64
	// sum is the checksum of the file so far (journalCRC).
	sum uint32
	// holds: the file holds the lease set OpenJournal returned.
	holds bool
}

// OpenJournal opens the lease journal at path for the leases of reg and
// returns the lease set it holds (Snapshot.Saved), to resume from
// (AcquireFrom). If there is none to use it returns a zero Snapshot and
// says why (fs.ErrNotExist: no journal yet); the journal is usable either
// way: Start writes it anew.
func OpenJournal(path string, reg *Registry) (*Journal, Snapshot, error) {
	j := &Journal{path: path, header: journalHeader{Journal: journalVersion, Prefix: reg.SubnetsPrefix()}}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return j, Snapshot{}, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxJournalSize+1))
	switch {
	case err != nil:
		err = fmt.Errorf("read lease journal %s: %w", path, err)
	case len(data) > maxJournalSize:
		err = fmt.Errorf("lease journal %s is larger than %d MiB", path, maxJournalSize>>20)
	}
	var snap Snapshot
	var r replayed
	if err == nil {
		if snap, r, err = decodeJournal(data, reg); err != nil {
			err = fmt.Errorf("lease journal %s: %w", path, err)
		}
	}
	if err == nil {
		// Cut off a batch a crash left half written, and append after
		// the last whole one.
		if err = f.Truncate(int64(r.end)); err == nil {
			_, err = f.Seek(int64(r.end), io.SeekStart)
		}
	}
	if err != nil {
		f.Close()
		return j, Snapshot{}, err
	}
	j.f, j.header.Cluster, j.keys, j.records, j.rev, j.sum, j.holds = f, snap.ClusterID, len(r.keys), r.records, snap.Revision, r.sum, true
	return j, snap, nil
}

// Start makes the journal hold snap, the lease set the watch starts from:
// nothing to do if snap is the set OpenJournal returned (a resumed
// start), else the file is written anew.
func (j *Journal) Start(snap Snapshot) error {
	if snap.Saved && j.holds && j.f != nil {
		return nil
	}
	j.header.Cluster = snap.ClusterID
	recs, err := snapshotRecords(j.header.Prefix, snap)
	if err != nil {
		return err
	}
	return j.rewrite(recs, snap.Revision)
}

// snapshotRecords are the records of snap's keys.
func snapshotRecords(prefix string, snap Snapshot) ([]journalRecord, error) {
	recs := make([]journalRecord, 0, len(snap.Leases)+len(snap.Invalid))
	for _, l := range snap.Leases {
		r, err := leaseRecord(l)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	for _, inv := range snap.Invalid {
		recs = append(recs, invalidRecord(prefix, inv))
	}
	return recs, nil
}

// Apply appends a batch of the watch (Batch; an empty one only moves the
// revision on).
func (j *Journal) Apply(b Batch) error {
	if j.f == nil {
		return errors.New("lease journal is not open")
	}
	var buf []byte
	n := 0
	add := func(r journalRecord) {
		buf = r.append(buf)
		n++
	}
	if b.Resync {
		// A re-list's Invalid is every invalid key it found.
		add(journalRecord{kind: recClear})
	}
	for _, ev := range b.Events {
		if ev.Type == subnet.Removed {
			add(journalRecord{kind: recGone, key: ev.Lease.Key()})
			continue
		}
		r, err := leaseRecord(ev.Lease)
		if err != nil {
			return err
		}
		add(r)
	}
	for _, key := range b.Deleted {
		add(journalRecord{kind: recGone, key: strings.TrimPrefix(key, j.header.Prefix)})
	}
	for _, inv := range b.Invalid {
		add(invalidRecord(j.header.Prefix, inv))
	}
	if n == 0 && b.Revision <= j.rev {
		return nil
	}
	add(journalRecord{kind: recRev, rev: b.Revision, sum: crc32.Update(j.sum, journalCRC, buf)})
	if _, err := j.f.Write(buf); err != nil {
		return fmt.Errorf("append to lease journal %s: %w", j.path, err)
	}
	j.sum = crc32.Update(j.sum, journalCRC, buf)
	j.records += n
	j.rev = b.Revision
	if j.records > 2*j.keys+journalSlack {
		return j.compact()
	}
	return nil
}

// Close closes the file; the journal stays on disk for the next start.
func (j *Journal) Close() error {
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// compact rewrites the file with one record per key.
func (j *Journal) compact() error {
	data, err := os.ReadFile(j.path)
	if err != nil {
		return fmt.Errorf("compact lease journal: %w", err)
	}
	r, err := replayJournal(data)
	if err != nil {
		return fmt.Errorf("compact lease journal %s: %w", j.path, err)
	}
	recs := make([]journalRecord, 0, len(r.keys))
	for _, rec := range r.keys {
		recs = append(recs, rec)
	}
	return j.rewrite(recs, r.rev)
}

// rewrite replaces the file with the header, recs and the revision, and
// keeps it open for appending.
func (j *Journal) rewrite(recs []journalRecord, rev int64) error {
	buf, err := encodeJournal(j.header, recs, rev)
	if err != nil {
		return err
	}
	tmp := j.path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write lease journal: %w", err)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return fmt.Errorf("write lease journal %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		f.Close()
		return fmt.Errorf("write lease journal: %w", err)
	}
	if j.f != nil {
		_ = j.f.Close()
	}
	j.f, j.keys, j.records, j.rev, j.sum, j.holds = f, len(recs), 0, rev, crc32.Checksum(buf, journalCRC), false
	return nil
}

func invalidRecord(prefix string, inv Invalid) journalRecord {
	msg := "invalid"
	if inv.Err != nil {
		msg = inv.Err.Error()
	}
	return journalRecord{kind: recInvalid, key: strings.TrimPrefix(inv.Key, prefix), mod: inv.ModRevision, err: msg}
}

func leaseRecord(l subnet.Lease) (journalRecord, error) {
	v, err := l.Attrs.Marshal()
	if err != nil {
		return journalRecord{}, fmt.Errorf("lease journal: encode %s: %w", l.Subnets(), err)
	}
	return journalRecord{kind: recLease, key: l.Key(), value: v, lease: l.EtcdLease, mod: l.ModRevision}, nil
}

// encodeJournal is a whole journal: the header, recs (sorted by key) and
// the revision they are at.
func encodeJournal(h journalHeader, recs []journalRecord, rev int64) ([]byte, error) {
	slices.SortFunc(recs, func(a, b journalRecord) int { return strings.Compare(a.key, b.key) })
	buf, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	buf = append(buf, '\n')
	for _, r := range recs {
		buf = r.append(buf)
	}
	return journalRecord{kind: recRev, rev: rev, sum: crc32.Checksum(buf, journalCRC)}.append(buf), nil
}

// append appends r's line to buf.
func (r journalRecord) append(buf []byte) []byte {
	buf = append(buf, r.kind)
	switch r.kind {
	case recLease:
		buf = strconv.AppendQuote(append(buf, ' '), r.key)
		buf = strconv.AppendInt(append(buf, ' '), r.lease, 10)
		buf = strconv.AppendInt(append(buf, ' '), r.mod, 10)
		buf = append(append(buf, ' '), r.value...)
	case recInvalid:
		buf = strconv.AppendQuote(append(buf, ' '), r.key)
		buf = strconv.AppendInt(append(buf, ' '), r.mod, 10)
		buf = strconv.AppendQuote(append(buf, ' '), r.err)
	case recGone:
		buf = strconv.AppendQuote(append(buf, ' '), r.key)
	case recRev:
		buf = strconv.AppendInt(append(buf, ' '), r.rev, 10)
		buf = strconv.AppendUint(append(buf, ' '), uint64(r.sum), 10)
	}
	return append(buf, '\n')
}

// parseRecord reads one line (without its newline).
func parseRecord(line string) (journalRecord, error) {
	if line == "" {
		return journalRecord{}, errors.New("empty line")
	}
	r := journalRecord{kind: line[0]}
	f := fields{s: line[1:]}
	switch r.kind {
	case recLease:
		r.key, r.lease, r.mod = f.quoted(), f.count(), f.count()
		r.value = []byte(f.rest())
	case recInvalid:
		r.key, r.mod, r.err = f.quoted(), f.count(), f.quoted()
	case recGone:
		r.key = f.quoted()
	case recClear:
	case recRev:
		if r.rev = f.count(); f.err == nil && r.rev == 0 {
			f.err = errors.New("revision 0")
		}
		if sum := f.count(); f.err == nil && sum > math.MaxUint32 {
			f.err = fmt.Errorf("checksum %d out of range", sum)
		} else {
			r.sum = uint32(sum)
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

// decodeJournal is the lease set a journal holds for the leases of reg,
// and what replaying it found.
func decodeJournal(data []byte, reg *Registry) (Snapshot, replayed, error) {
	r, err := replayJournal(data)
	if err != nil {
		return Snapshot{}, r, err
	}
	if r.header.Prefix != reg.SubnetsPrefix() {
		return Snapshot{}, r, fmt.Errorf("it holds the leases under %s; the network's are under %s", r.header.Prefix, reg.SubnetsPrefix())
	}
	snap := Snapshot{Revision: r.rev, ClusterID: r.header.Cluster, Saved: true}
	names := make([]string, 0, len(r.keys))
	for k := range r.keys {
		names = append(names, k)
	}
	slices.Sort(names) // etcd's order, as List returns them
	for _, k := range names {
		rec := r.keys[k]
		key := r.header.Prefix + k
		if rec.kind == recInvalid {
			snap.Invalid = append(snap.Invalid, Invalid{Key: key, ModRevision: rec.mod, Err: errors.New(rec.err)})
			continue
		}
		l, err := reg.decode([]byte(key), rec.value, rec.lease, rec.mod)
		if err != nil {
			// It decoded when it was written: the file is damaged.
			return Snapshot{}, r, fmt.Errorf("lease %s: %w", k, err)
		}
		snap.Leases = append(snap.Leases, l)
	}
	return snap, r, nil
}

// replayed is what a journal holds at its last R record.
type replayed struct {
	header journalHeader
	keys   map[string]journalRecord
	rev    int64
	// end is the length of the file up to the last R record, and
	// records how many records follow the header up to there; sum is
	// the checksum of those end bytes.
	end, records int
	sum          uint32
}

// replayJournal reads a journal's header and the keys it holds at its last
// R record. Lines after that record are not part of a whole batch; the
// last line is cut short if it does not end in a newline.
func replayJournal(data []byte) (replayed, error) {
	var r replayed
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if err := json.Unmarshal(first, &r.header); err != nil {
		return r, fmt.Errorf("header: %w", err)
	}
	if r.header.Journal != journalVersion {
		return r, fmt.Errorf("format %d, want %d", r.header.Journal, journalVersion)
	}
	r.keys = map[string]journalRecord{}
	offset := min(len(first)+1, len(data))
	sum := crc32.Checksum(data[:offset], journalCRC)
	var pending []journalRecord
	for n := 2; ; n++ {
		line, next, complete := bytes.Cut(rest, []byte("\n"))
		if !complete {
			break
		}
		whole := rest[:len(line)+1]
		offset += len(whole)
		rest = next
		rec, err := parseRecord(string(line))
		if err != nil {
			return r, fmt.Errorf("line %d: %w", n, err)
		}
		if rec.kind != recRev {
			pending = append(pending, rec)
			sum = crc32.Update(sum, journalCRC, whole)
			continue
		}
		if rec.sum != sum {
			return r, fmt.Errorf("line %d: checksum %d, want %d: the file was changed after it was written", n, rec.sum, sum)
		}
		if rec.rev < r.rev {
			return r, fmt.Errorf("line %d: revision %d after %d", n, rec.rev, r.rev)
		}
		for _, p := range pending {
			r.apply(p)
		}
		sum = crc32.Update(sum, journalCRC, whole)
		r.records += len(pending) + 1
		pending, r.rev, r.end, r.sum = pending[:0], rec.rev, offset, sum
	}
	if r.rev == 0 {
		return r, errors.New("holds no complete lease set")
	}
	return r, nil
}

func (r *replayed) apply(rec journalRecord) {
	switch rec.kind {
	case recClear:
		for k, v := range r.keys {
			if v.kind == recInvalid {
				delete(r.keys, k)
			}
		}
	case recGone:
		delete(r.keys, rec.key)
	default:
		r.keys[rec.key] = rec
	}
}
