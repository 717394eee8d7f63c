package e2e

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// withoutNetAdmin is the variable that makes the test binary a launcher:
// it drops CAP_NET_ADMIN for good (bounding, inheritable, ambient and
// effective sets) and execs the program the variable names with the
// binary's arguments. A process started as root keeps no capability its
// bounding set lacks across execve, so the program runs as root without
// CAP_NET_ADMIN, as under a container runtime or unit that withholds it.
const withoutNetAdmin = "E2E_EXEC_WITHOUT_NET_ADMIN"

func TestMain(m *testing.M) {
	if prog := os.Getenv(withoutNetAdmin); prog != "" {
		fmt.Fprintln(os.Stderr, execWithoutNetAdmin(prog))
		os.Exit(127)
	}
	os.Exit(m.Run())
}

// execWithoutNetAdmin only returns on failure.
func execWithoutNetAdmin(prog string) error {
	// The bounding set and capabilities are per thread; execve happens on
	// this one.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_NET_ADMIN, 0, 0, 0); err != nil {
		return fmt.Errorf("drop CAP_NET_ADMIN from the bounding set: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Inheritable &^= 1 << unix.CAP_NET_ADMIN
	data[0].Effective &^= 1 << unix.CAP_NET_ADMIN
	data[0].Permitted &^= 1 << unix.CAP_NET_ADMIN
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop CAP_NET_ADMIN: %w", err)
	}
	// The test set the environment (testenv.ProgramEnv); the program gets
	// it less the launcher's own variable, and less any caller setting.
	env := slices.DeleteFunc(testenv.ProgramEnv(), func(kv string) bool { return strings.HasPrefix(kv, withoutNetAdmin+"=") })
	return syscall.Exec(prog, append([]string{prog}, os.Args[1:]...), env)
}
