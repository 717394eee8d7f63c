package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// A second `overlayd run` on a host, with its own --subnet-file and
// --health-addr, refuses at once (exit 1) naming the first one's PID,
// instead of running beside it on the same device and lease; the first
// runs on, ready, with its lease unchanged.
func TestSecondOverlaydOnAHostRefuses(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	h := labtest.Hosts(t, l, 1)[0]
	before := lease(t, h)
	args := h.RunArgs()
	if !strings.HasPrefix(args[0], "--endpoints=") || args[1] != "run" {
		t.Fatalf("RunArgs = %q: want --endpoints first, then run", args)
	}
	args = append(args[1:], "--subnet-file="+filepath.Join(h.Dir, "second", "subnet.env"), "--health-addr=127.0.0.1:9437")
	_, err := h.CLI(ctxT(t, 30*time.Second), args...)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second overlayd run: %v; want exit 1", err)
	}
	want := fmt.Sprintf("overlayd is running on this host (pid %d (overlayd) holds", h.PID())
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "stop it first") {
		t.Errorf("second overlayd run: %v; want %q and advice to stop it", err, want)
	}
	labtest.WaitReady(t, h)
	if after := lease(t, h); after != before {
		t.Errorf("lease changed from %s to %s", before, after)
	}
}
