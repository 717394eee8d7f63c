package etcdv3

import (
	"log/slog"
	"testing"

	"github.com/overlaynet/overlay/subnet"
)

// A resumed watch (catchUp = the old store's head 5000) whose store is
// re-created: rebased forgets w.head, but not w.catchUp; the re-list of the
// new store (revision 12) is current, yet it is not marked CaughtUp, so the
// daemon's catchUp keeps waiting until the new store passes 5000.
func TestRebasedWatchCatchesUpOnRelist(t *testing.T) {
	w := &watcher{log: slog.New(slog.DiscardHandler), rev: 4000, head: 5000, catchUp: 5000}
	w.rebased(2)
	out := make(chan subnet.Batch, 1)
	w.send(t.Context(), out, subnet.Batch{Revision: 12, Resync: true})
	b := <-out
	if !b.CaughtUp {
		t.Fatalf("re-list of the re-created store at %d: CaughtUp=%v (w.head=%d, w.catchUp=%d); the daemon's catch-up waits on", b.Revision, b.CaughtUp, w.head, w.catchUp)
	}
}
