package e2e

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
)

// SIGHUP (a closed terminal, a `kill -HUP` habit) neither ends overlayd
// nor changes anything: it is logged, the daemon stays ready, and a later
// SIGTERM still ends it cleanly (exit 0).
func TestSIGHUPIsLoggedAndIgnored(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	h := labtest.Hosts(t, l, 1)[0]
	pid := h.PID()
	exited, how := h.Exited()
	// The PID of a process the lab started and has not reaped.
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	labtest.Eventually(t, settle, "SIGHUP logged", func() error {
		select {
		case <-exited:
			t.Fatalf("overlayd exited on SIGHUP: %v", how())
		default:
		}
		data, err := os.ReadFile(h.LogFile)
		if err != nil {
			return err
		}
		if !strings.Contains(string(data), "SIGHUP ignored") {
			return errors.New("not logged yet")
		}
		return nil
	})
	labtest.WaitReady(t, h)
	if h.PID() != pid {
		t.Fatalf("overlayd's pid changed from %d to %d", pid, h.PID())
	}
	if err := h.Stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM after SIGHUP: %v", err)
	}
}
