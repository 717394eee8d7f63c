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

// savedLeases is the lease set the last run saved, or zero if there is
// none to use (AcquireFrom then lists, as a first start does).
func (d *daemon) savedLeases() etcdv3.Snapshot {
	path := etcdv3.JournalFile(d.cfg.SubnetFile)
	saved, err := etcdv3.LoadJournal(path, d.reg)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("ignoring the lease journal; listing every lease instead", "err", err)
	}
	return saved
}

// startJournal saves the start-up lease set as the journal the loop
// appends each batch to. Without a journal the daemon works as well; the
// next start just lists.
func (d *daemon) startJournal() {
	path := etcdv3.JournalFile(d.cfg.SubnetFile)
	j, err := etcdv3.CreateJournal(path, d.reg, d.snap)
	if err != nil {
		d.log.Warn("cannot keep the lease journal; a restart will list every lease", "err", err)
		return
	}
	d.journal = j
	d.closers = append(d.closers, func() { _ = j.Close() })
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
