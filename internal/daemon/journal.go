package daemon

import (
	"errors"
	"io/fs"

	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// The lease journal (etcdv3.Journal) lets a restart resume the lease watch
// where the last run left it instead of listing every lease: with every
// host of a large cluster restarting at once, those listings are what
// keeps etcd busy. It lives beside the subnet file, which the host lock
// makes this daemon's alone.

// savedLeases opens the lease journal and returns the lease set the last
// run saved in it, or zero if there is none to use (AcquireFrom then
// lists, as a first start does).
func (d *daemon) savedLeases() etcdv3.Snapshot {
	j, saved, err := etcdv3.OpenJournal(etcdv3.JournalFile(d.cfg.SubnetFile), d.reg)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("ignoring the lease journal; listing every lease instead", "err", err)
	}
	d.journal = j
	d.closers = append(d.closers, func() { _ = j.Close() })
	return saved
}

// startJournal makes the journal hold the start-up lease set, which the
// loop then appends each batch to. Without a journal the daemon works as
// well; the next start just lists.
func (d *daemon) startJournal() {
	if err := d.journal.Start(d.snap); err != nil {
		d.log.Warn("cannot keep the lease journal; a restart will list every lease", "err", err)
		_ = d.journal.Close()
		d.journal = nil
	}
}

// journalBatch appends a batch of the lease watch to the journal; after a
// failure (a full disk) the journal stops, and what it holds, the lease
// set at an earlier revision, is still true for a restart to resume from.
func (d *daemon) journalBatch(b etcdv3.Batch) {
	if d.journal == nil {
		return
	}
	if err := d.journal.Apply(b); err != nil {
		d.log.Warn("stopped keeping the lease journal; a restart will resume from an older revision", "err", err)
		_ = d.journal.Close()
		d.journal = nil
	}
}
