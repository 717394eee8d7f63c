package etcdv3

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/overlaynet/overlay/subnet"
)

// The lease journal keeps the lease set a host follows, with the revision
// it is current to, in a local file (beside subnet.env), so that a
// restarted overlayd resumes its watch from there instead of listing every
// lease: when a whole fleet restarts at once, N hosts each reading N leases
// is what keeps etcd busy (Documentation/scale.md).
//
// The file is a header line, then records, one JSON object per line,
// appended as the watch delivers batches:
//
//	{"journal":1,"prefix":"/coreos.com/network/subnets/","cluster":1234}
//	{"key":"10.244.1.0-24","value":{...},"lease":7587,"mod":12}   a lease
//	{"key":"10.244.9.0-24","mod":13,"invalid":"..."}               a key whose value does not decode
//	{"key":"10.244.1.0-24","gone":true}                            a key deleted
//	{"clearInvalid":true}                                          a re-list follows: forget the invalid keys
//	{"rev":14}                                                     what precedes is the lease set at revision 14
//
// What follows the last rev record (a write cut short) is ignored. Once
// the records outnumber twice the keys, the file is rewritten with one
// record per key. Appending costs a host what changed, not the size of the
// lease set; the file is rewritten to a new name and renamed, so it is
// always whole.
//
// The file is untrusted input like etcd's values: each lease in it goes
// through the decoding every lease from etcd goes through, and
// Manager.AcquireFrom checks the set against etcd before using it.

// journalVersion is the format written in the header.
const journalVersion = 1

// maxJournalSize bounds what LoadJournal reads: 65,536 leases take about
// 20 MB written compactly.
const maxJournalSize = 256 << 20

// journalSlack is how many records a journal may gain beyond twice its
// keys before it is rewritten.
const journalSlack = 1024

type journalHeader struct {
	Journal int    `json:"journal"`
	Prefix  string `json:"prefix"`
	Cluster uint64 `json:"cluster"`
}

type journalRecord struct {
	Key          string          `json:"key,omitempty"`
	Value        json.RawMessage `json:"value,omitempty"`
	Lease        int64           `json:"lease,omitempty"`
	Mod          int64           `json:"mod,omitempty"`
	Invalid      string          `json:"invalid,omitempty"`
	Gone         bool            `json:"gone,omitempty"`
	ClearInvalid bool            `json:"clearInvalid,omitempty"`
	Rev          int64           `json:"rev,omitempty"`
}

// Journal appends the batches of a watch to a lease journal file. It is
// not safe for concurrent use.
type Journal struct {
	path   string
	header journalHeader
	f      *os.File
	// keys is how many keys the file held when last rewritten; records
	// how many records were appended since.
	keys, records int
	rev           int64
}

// CreateJournal writes snap as the journal at path (replacing any) for the
// leases of reg, and returns it open for the batches that follow.
func CreateJournal(path string, reg *Registry, snap Snapshot) (*Journal, error) {
	j := &Journal{path: path, header: journalHeader{Journal: journalVersion, Prefix: reg.SubnetsPrefix(), Cluster: snap.ClusterID}}
	recs, err := snapshotRecords(j.header.Prefix, snap)
	if err != nil {
		return nil, err
	}
	if err := j.rewrite(recs, snap.Revision); err != nil {
		return nil, err
	}
	return j, nil
}

// snapshotRecords are the records of snap's keys.
func snapshotRecords(prefix string, snap Snapshot) ([]journalRecord, error) {
	recs := make([]journalRecord, 0, len(snap.Leases)+len(snap.Invalid)+1)
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

// JournalFile is where overlayd keeps the lease journal: beside the subnet
// file, e.g. /run/flannel/subnet.env.leases.
func JournalFile(subnetFile string) string { return subnetFile + ".leases" }

// Apply appends a batch of the watch (Batch; an empty one only moves the
// revision on).
func (j *Journal) Apply(b Batch) error {
	if j.f == nil {
		return errors.New("lease journal is closed")
	}
	var recs []journalRecord
	if b.Resync {
		// A re-list's Invalid is every invalid key it found.
		recs = append(recs, journalRecord{ClearInvalid: true})
	}
	for _, ev := range b.Events {
		if ev.Type == subnet.Removed {
			recs = append(recs, journalRecord{Key: ev.Lease.Key(), Gone: true})
			continue
		}
		r, err := leaseRecord(ev.Lease)
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	for _, key := range b.Deleted {
		recs = append(recs, journalRecord{Key: strings.TrimPrefix(key, j.header.Prefix), Gone: true})
	}
	for _, inv := range b.Invalid {
		recs = append(recs, invalidRecord(j.header.Prefix, inv))
	}
	if len(recs) == 0 && b.Revision <= j.rev {
		return nil
	}
	recs = append(recs, journalRecord{Rev: b.Revision})
	buf, err := encodeRecords(nil, recs)
	if err != nil {
		return err
	}
	if _, err := j.f.Write(buf); err != nil {
		return fmt.Errorf("append to lease journal %s: %w", j.path, err)
	}
	j.records += len(recs)
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
	_, keys, rev, err := replayJournal(data)
	if err != nil {
		return fmt.Errorf("compact lease journal %s: %w", j.path, err)
	}
	recs := make([]journalRecord, 0, len(keys)+1)
	for _, r := range keys {
		recs = append(recs, r)
	}
	return j.rewrite(recs, rev)
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
	j.f, j.keys, j.records, j.rev = f, len(recs), 0, rev
	return nil
}

// encodeJournal is a whole journal: the header, recs (sorted by key) and
// the revision they are at.
func encodeJournal(h journalHeader, recs []journalRecord, rev int64) ([]byte, error) {
	slices.SortFunc(recs, func(a, b journalRecord) int { return strings.Compare(a.Key, b.Key) })
	buf, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	return encodeRecords(append(buf, '\n'), append(recs, journalRecord{Rev: rev}))
}

func invalidRecord(prefix string, inv Invalid) journalRecord {
	msg := "invalid"
	if inv.Err != nil {
		msg = inv.Err.Error()
	}
	return journalRecord{Key: strings.TrimPrefix(inv.Key, prefix), Mod: inv.ModRevision, Invalid: msg}
}

func leaseRecord(l subnet.Lease) (journalRecord, error) {
	v, err := l.Attrs.Marshal()
	if err != nil {
		return journalRecord{}, fmt.Errorf("lease journal: encode %s: %w", l.Subnets(), err)
	}
	return journalRecord{Key: l.Key(), Value: v, Lease: l.EtcdLease, Mod: l.ModRevision}, nil
}

func encodeRecords(buf []byte, recs []journalRecord) ([]byte, error) {
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("lease journal: %w", err)
		}
		buf = append(append(buf, line...), '\n')
	}
	return buf, nil
}

// LoadJournal reads the lease set saved at path for the leases of reg.
// The error says why there is none to use (fs.ErrNotExist: no journal).
func LoadJournal(path string, reg *Registry) (Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return Snapshot{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJournalSize+1))
	if err != nil {
		return Snapshot{}, fmt.Errorf("read lease journal %s: %w", path, err)
	}
	if len(data) > maxJournalSize {
		return Snapshot{}, fmt.Errorf("lease journal %s is larger than %d MiB", path, maxJournalSize>>20)
	}
	snap, err := decodeJournal(data, reg)
	if err != nil {
		return Snapshot{}, fmt.Errorf("lease journal %s: %w", path, err)
	}
	return snap, nil
}

// decodeJournal is the lease set a journal holds for the leases of reg.
func decodeJournal(data []byte, reg *Registry) (Snapshot, error) {
	h, keys, rev, err := replayJournal(data)
	if err != nil {
		return Snapshot{}, err
	}
	if h.Prefix != reg.SubnetsPrefix() {
		return Snapshot{}, fmt.Errorf("it holds the leases under %s; the network's are under %s", h.Prefix, reg.SubnetsPrefix())
	}
	snap := Snapshot{Revision: rev, ClusterID: h.Cluster}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names) // etcd's order, as List returns them
	for _, k := range names {
		r := keys[k]
		key := h.Prefix + k
		if r.Invalid != "" {
			snap.Invalid = append(snap.Invalid, Invalid{Key: key, ModRevision: r.Mod, Err: errors.New(r.Invalid)})
			continue
		}
		l, err := reg.decode([]byte(key), r.Value, r.Lease, r.Mod)
		if err != nil {
			// It decoded when it was written: the file is damaged.
			return Snapshot{}, fmt.Errorf("lease %s: %w", k, err)
		}
		snap.Leases = append(snap.Leases, l)
	}
	return snap, nil
}

// replayJournal reads a journal's header and the keys it holds at its last
// rev record, with that revision.
func replayJournal(data []byte) (journalHeader, map[string]journalRecord, int64, error) {
	var h journalHeader
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if err := json.Unmarshal(first, &h); err != nil {
		return h, nil, 0, fmt.Errorf("header: %w", err)
	}
	if h.Journal != journalVersion {
		return h, nil, 0, fmt.Errorf("format %d, want %d", h.Journal, journalVersion)
	}
	keys := map[string]journalRecord{}
	// Records after the last rev record are not part of a whole batch.
	var pending []journalRecord
	var rev int64
	for n := 2; len(rest) > 0; n++ {
		var line []byte
		var complete bool
		line, rest, complete = bytes.Cut(rest, []byte("\n"))
		var r journalRecord
		if err := json.Unmarshal(line, &r); err != nil {
			if !complete {
				break // the last line, cut short
			}
			return h, nil, 0, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case r.Rev < 0 || r.Mod < 0 || r.Lease < 0:
			return h, nil, 0, fmt.Errorf("line %d: negative revision or lease", n)
		case r.Rev > 0:
			if r.Rev < rev {
				return h, nil, 0, fmt.Errorf("line %d: revision %d after %d", n, r.Rev, rev)
			}
			for _, p := range pending {
				applyRecord(keys, p)
			}
			pending, rev = pending[:0], r.Rev
		case r.ClearInvalid || r.Key != "":
			pending = append(pending, r)
		default:
			return h, nil, 0, fmt.Errorf("line %d: a record with neither key nor revision", n)
		}
	}
	if rev == 0 {
		return h, nil, 0, errors.New("holds no complete lease set")
	}
	return h, keys, rev, nil
}

func applyRecord(keys map[string]journalRecord, r journalRecord) {
	switch {
	case r.ClearInvalid:
		for k, v := range keys {
			if v.Invalid != "" {
				delete(keys, k)
			}
		}
	case r.Gone:
		delete(keys, r.Key)
	default:
		keys[r.Key] = r
	}
}
