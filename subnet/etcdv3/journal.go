package etcdv3

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3/journal"
)

// The lease journal keeps the lease set a host follows, with the revision
// it is current to, in a local file (beside subnet.env), so that a
// restarted overlayd resumes its watch from there instead of listing every
// lease: when a whole fleet restarts at once, N hosts each reading N leases
// is what keeps etcd busy (Documentation/scale.md). The file's format,
// checksums included, is package journal's.
//
// The checksums make a file changed after it was written (a bit flipped, a
// line lost) refused rather than resumed from: Manager.AcquireFrom checks
// only this host's own key against etcd, as a count of every key would
// cost etcd a walk over all of them per restart. What follows the last R
// record (a write cut short) is cut off when the file is opened. Once the
// records outnumber twice the keys, the file is rewritten with one record
// per key, to a new name and renamed, so it is always whole. Appending
// costs a host what changed, not the size of the lease set, and keeps no
// lease value in memory; reading it back costs little more than decoding
// the values, which have to be decoded anyway.
//
// The file is untrusted input like etcd's values: each lease in it goes
// through the decoding every lease from etcd goes through, and
// Manager.AcquireFrom checks it against etcd before using it.

// maxJournalSize bounds what OpenJournal reads: 65,536 leases take about
// 20 MB written compactly.
const maxJournalSize = 256 << 20

// journalSlack is how many records a journal may gain beyond twice its
// keys before it is rewritten.
const journalSlack = 1024

// JournalFile is where overlayd keeps the lease journal: beside the subnet
// file, e.g. /run/flannel/subnet.env.leases.
func JournalFile(subnetFile string) string { return subnetFile + ".leases" }

// Journal appends the batches of a watch to a lease journal file. It is
// not safe for concurrent use.
type Journal struct {
	path   string
	header journal.Header
	f      *os.File
	// keys is how many keys the file held when last written whole;
	// records how many records it has gained since.
	keys, records int
	rev           int64
	// sum is the checksum of the file so far (journal.Checksum).
	sum uint32
	// holds: the file holds the lease set OpenJournal returned.
	holds bool
}

// OpenJournal opens the lease journal at path for the leases of reg and
// returns the lease set it holds (Snapshot.Saved), to resume from
// (AcquireFrom). If there is none to use it returns a zero Snapshot and
// says why (fs.ErrNotExist: no journal yet); the journal is usable either
// way: Start writes it anew.
func OpenJournal(path string, reg *Registry) (*Journal, subnet.Snapshot, error) {
	j := &Journal{path: path, header: journal.Header{Journal: journal.Version, Prefix: reg.Keys.SubnetsPrefix()}}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return j, subnet.Snapshot{}, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxJournalSize+1))
	switch {
	case err != nil:
		err = fmt.Errorf("read lease journal %s: %w", path, err)
	case len(data) > maxJournalSize:
		err = fmt.Errorf("lease journal %s is larger than %d MiB", path, maxJournalSize>>20)
	}
	var snap subnet.Snapshot
	var r journal.Replayed
	if err == nil {
		if snap, r, err = decodeJournal(data, reg); err != nil {
			err = fmt.Errorf("lease journal %s: %w", path, err)
		}
	}
	if err == nil {
		// Cut off a batch a crash left half written, and append after
		// the last whole one.
		if err = f.Truncate(int64(r.End)); err == nil {
			_, err = f.Seek(int64(r.End), io.SeekStart)
		}
	}
	if err != nil {
		f.Close()
		return j, subnet.Snapshot{}, err
	}
	j.f, j.header.Cluster, j.keys, j.records, j.rev, j.sum, j.holds = f, snap.ClusterID, len(r.Keys), r.Records, snap.Revision, r.Sum, true
	return j, snap, nil
}

// Start makes the journal hold snap, the lease set the watch starts from:
// nothing to do if snap is the set OpenJournal returned (a resumed
// start), else the file is written anew.
func (j *Journal) Start(snap subnet.Snapshot) error {
	if snap.Saved && j.holds && j.f != nil {
		return nil
	}
	j.header.Cluster = snap.ClusterID
	if len(snap.Invalid) == 0 {
		// A listing's leases come in etcd's order, the file's: each is
		// written as it is made, with no record of every lease in memory
		// at once (a megabyte at 10,000 leases, at the start-up's peak).
		err := j.rewriteSorted(len(snap.Leases), func(i int) (journal.Record, error) { return leaseRecord(snap.Leases[i]) }, snap.Revision)
		if !errors.Is(err, journal.ErrUnsorted) {
			return err
		}
	}
	recs, err := snapshotRecords(j.header.Prefix, snap)
	if err != nil {
		return err
	}
	return j.rewrite(recs, snap.Revision)
}

// snapshotRecords are the records of snap's keys.
func snapshotRecords(prefix string, snap subnet.Snapshot) ([]journal.Record, error) {
	recs := make([]journal.Record, 0, len(snap.Leases)+len(snap.Invalid))
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
func (j *Journal) Apply(b subnet.Batch) error {
	if j.f == nil {
		return errors.New("lease journal is not open")
	}
	switch {
	case b.Resync && (b.Revision < j.rev || b.ClusterID != 0 && b.ClusterID != j.header.Cluster):
		return j.rebase(b)
	case b.Revision < j.rev:
		// Replay would refuse the file from here on: keep it readable.
		return fmt.Errorf("lease journal %s: a batch at revision %d after %d", j.path, b.Revision, j.rev)
	}
	recs, err := j.recordsOf(b)
	if err != nil {
		return err
	}
	n := len(recs)
	if n == 0 && b.Revision <= j.rev {
		return nil
	}
	var buf []byte
	for _, r := range recs {
		buf = r.Append(buf)
	}
	buf = journal.Seal(b.Revision, journal.Checksum(j.sum, buf)).Append(buf)
	if _, err := j.f.Write(buf); err != nil {
		return fmt.Errorf("append to lease journal %s: %w", j.path, err)
	}
	j.sum = journal.Checksum(j.sum, buf)
	j.records += n + 1 // and the seal
	j.rev = b.Revision
	if j.records > 2*j.keys+journalSlack {
		return j.compact()
	}
	return nil
}

// recordsOf are b's records, in the order they apply.
func (j *Journal) recordsOf(b subnet.Batch) ([]journal.Record, error) {
	var recs []journal.Record
	if b.Resync {
		// A re-list's Invalid is every invalid key it found.
		recs = append(recs, journal.Record{Kind: journal.KindClear})
	}
	for _, ev := range b.Events {
		if ev.Type == subnet.Removed {
			recs = append(recs, journal.Record{Kind: journal.KindGone, Key: ev.Lease.Key()})
			continue
		}
		r, err := leaseRecord(ev.Lease)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	for _, key := range b.Deleted {
		recs = append(recs, journal.Record{Kind: journal.KindGone, Key: strings.TrimPrefix(key, j.header.Prefix)})
	}
	for _, inv := range b.Invalid {
		recs = append(recs, invalidRecord(j.header.Prefix, inv))
	}
	return recs, nil
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
	r, err := j.replay()
	if err != nil {
		return fmt.Errorf("compact lease journal %s: %w", j.path, err)
	}
	return j.rewrite(slices.Collect(maps.Values(r.Keys)), r.Rev)
}

// rebase rewrites the file with the set after b, a re-list of a store
// that was re-created (its revisions start over, its cluster ID may be
// new): appended, its revision would make the file unreadable.
func (j *Journal) rebase(b subnet.Batch) error {
	r, err := j.replay()
	if err != nil {
		return fmt.Errorf("lease journal %s: %w", j.path, err)
	}
	recs, err := j.recordsOf(b)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		r.Apply(rec)
	}
	if b.ClusterID != 0 {
		j.header.Cluster = b.ClusterID
	}
	return j.rewrite(slices.Collect(maps.Values(r.Keys)), b.Revision)
}

// replay reads back what the file holds.
func (j *Journal) replay() (journal.Replayed, error) {
	data, err := os.ReadFile(j.path)
	if err != nil {
		return journal.Replayed{}, err
	}
	return journal.Replay(data)
}

// rewrite replaces the file with the header, recs and the revision, and
// keeps it open for appending.
func (j *Journal) rewrite(recs []journal.Record, rev int64) error {
	return j.write(len(recs), func(w io.Writer) (uint32, error) { return journal.EncodeTo(w, j.header, recs, rev) }, rev)
}

// rewriteSorted is rewrite for n records that rec makes in key order
// (journal.EncodeSorted); it fails with journal.ErrUnsorted, the file
// unchanged, if they are not in order.
func (j *Journal) rewriteSorted(n int, rec func(int) (journal.Record, error), rev int64) error {
	return j.write(n, func(w io.Writer) (uint32, error) { return journal.EncodeSorted(w, j.header, n, rec, rev) }, rev)
}

// write replaces the file with what encode writes, n keys at revision rev.
func (j *Journal) write(n int, encode func(io.Writer) (uint32, error), rev int64) error {
	tmp := j.path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write lease journal: %w", err)
	}
	sum, err := encode(f)
	if err != nil {
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
	j.f, j.keys, j.records, j.rev, j.sum, j.holds = f, n, 0, rev, sum, false
	return nil
}

func invalidRecord(prefix string, inv subnet.Invalid) journal.Record {
	msg := "invalid"
	if inv.Err != nil {
		msg = inv.Err.Error()
	}
	return journal.Record{Kind: journal.KindInvalid, Key: strings.TrimPrefix(inv.Key, prefix), Mod: inv.ModRevision, Err: msg}
}

// leaseRecord is l's record. Its value is the one l was read from, as it
// is (decoded once, where it came in), unless there is none or it spans
// lines (JSON may; a record may not): then Attrs encoded again.
func leaseRecord(l subnet.Lease) (journal.Record, error) {
	v := l.Value
	if len(v) == 0 || bytes.IndexByte(v, '\n') >= 0 {
		var err error
		if v, err = l.Attrs.Marshal(); err != nil {
			return journal.Record{}, fmt.Errorf("lease journal: encode %s: %w", l.Subnets(), err)
		}
	}
	return journal.Record{Kind: journal.KindLease, Key: l.Key(), Value: v, Lease: l.EtcdLease, Mod: l.ModRevision}, nil
}

// decodeJournal is the lease set a journal holds for the leases of reg,
// and what replaying it found.
func decodeJournal(data []byte, reg *Registry) (subnet.Snapshot, journal.Replayed, error) {
	r, err := journal.Replay(data)
	if err != nil {
		return subnet.Snapshot{}, r, err
	}
	if r.Header.Prefix != reg.Keys.SubnetsPrefix() {
		return subnet.Snapshot{}, r, fmt.Errorf("it holds the leases under %s; the network's are under %s", r.Header.Prefix, reg.Keys.SubnetsPrefix())
	}
	snap := subnet.Snapshot{Revision: r.Rev, ClusterID: r.Header.Cluster, Saved: true}
	names := make([]string, 0, len(r.Keys))
	for k := range r.Keys {
		names = append(names, k)
	}
	slices.Sort(names) // etcd's order, as List returns them
	for _, k := range names {
		rec := r.Keys[k]
		key := r.Header.Prefix + k
		if rec.Kind == journal.KindInvalid {
			snap.Invalid = append(snap.Invalid, reg.Keys.invalid(key, rec.Mod, errors.New(rec.Err)))
			continue
		}
		l, err := reg.Keys.decode([]byte(key), rec.Value, rec.Lease, rec.Mod)
		if err != nil {
			// It decoded when it was written: the file is damaged.
			return subnet.Snapshot{}, r, fmt.Errorf("lease %s: %w", k, err)
		}
		snap.Leases = append(snap.Leases, l)
	}
	return snap, r, nil
}
