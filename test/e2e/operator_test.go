package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
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

// A host whose VXLAN port is taken by a UDP socket: overlayd exits 1 at
// start naming the process and `ss -ulpn`, and leaves nothing in etcd (no
// lease every other host would route to, no liveness key). Once the
// socket is gone it starts.
func TestPortInUseLeavesNoLease(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	h, err := l.AddNode("h1", 1)
	if err != nil {
		t.Fatal(err)
	}
	var sock net.PacketConn
	if err := lab.Do(h.NS, func() (err error) {
		sock, err = net.ListenPacket("udp4", "0.0.0.0:8472")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	exited, how := h.Exited()
	select {
	case <-exited:
	case <-time.After(testenv.Deadline(30 * time.Second)):
		t.Fatal("overlayd did not exit with its port taken")
	}
	var exit *exec.ExitError
	if err := how(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("overlayd with its port taken: %v, want exit 1", err)
	}
	log, err := os.ReadFile(h.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("UDP port 8472 is in use by %s (pid %d)", filepath.Base(os.Args[0])[:min(15, len(filepath.Base(os.Args[0])))], os.Getpid())
	if !strings.Contains(string(log), want) || !strings.Contains(string(log), "`ss -ulpn`") {
		t.Errorf("log does not say %q and `ss -ulpn`:\n%s", want, log)
	}
	noKeysBut(t, l, "/coreos.com/network/config")

	sock.Close()
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h)
}

// overlayd run without CAP_NET_ADMIN over its network namespace exits 1
// at start saying it needs the capability, and leaves nothing in etcd:
// run as root with the capability withheld (by the launcher in
// main_test.go), or as root of a user namespace of its own (a rootless
// container: every capability, none of them over the host's network).
func TestWithoutNetAdminNothingIsPublished(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		launch func(l *lab.Lab, args []string) *exec.Cmd
		want   string
	}{
		{"capability withheld", func(l *lab.Lab, args []string) *exec.Cmd {
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = testenv.ProgramEnv(withoutNetAdmin + "=" + l.Binary("overlayd"))
			return cmd
		}, "Error: overlayd needs CAP_NET_ADMIN to create its VXLAN device"},
		{"user namespace of its own", func(l *lab.Lab, args []string) *exec.Cmd {
			cmd := exec.Command(l.Binary("overlayd"), args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}}
			cmd.Env = testenv.ProgramEnv()
			return cmd
		}, "Error: overlayd needs CAP_NET_ADMIN in the user namespace that owns its network namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := labtest.New(t, lab.Config{})
			h, err := l.AddNode("h1", 1)
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			cmd := tc.launch(l, h.RunArgs())
			cmd.Stdout, cmd.Stderr = &out, &out
			if cmd.SysProcAttr == nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{}
			}
			cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
			if err := lab.Do(h.NS, cmd.Start); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err = <-done:
			case <-time.After(testenv.Deadline(30 * time.Second)):
				_ = cmd.Process.Kill() // the process this test started
				<-done
				t.Fatalf("overlayd did not exit:\n%s", out.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("overlayd: %v, want exit 1 saying %q:\n%s", err, tc.want, out.String())
			}
			noKeysBut(t, l, "/coreos.com/network/config")
		})
	}
}

// noKeysBut fails t if etcd holds a key under the default prefix other
// than keep.
func noKeysBut(t *testing.T, l *lab.Lab, keep string) {
	t.Helper()
	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctxT(t, 10*time.Second), "/coreos.com/network/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if k := string(kv.Key); k != keep {
			t.Errorf("left in etcd by a start that could not serve: %s", k)
		}
	}
}
