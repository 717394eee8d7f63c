package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// published lists the keys under the lease and liveness prefixes.
func published(t *testing.T, c *cluster) []string {
	t.Helper()
	var keys []string
	for _, dir := range []string{"/subnets/", "/subnets6/", "/nodes/"} {
		resp, err := c.srv.Client(t).Get(tctx(t), etcdv3.DefaultPrefix+dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}

// A host that cannot build its data path publishes nothing: no lease, no
// liveness key. overlayd refuses at start, before claiming, saying what
// holds the VXLAN port or that it lacks CAP_NET_ADMIN, and what to do.
// Its own device from an earlier run, and flanneld's with
// --adopt-flannel, are on the port legitimately.
func TestNothingIsPublishedThatTheHostCannotServe(t *testing.T) {
	c := newCluster(t)

	addVxlan := func(t *testing.T, h *node, name string, vni int) {
		t.Helper()
		nl, err := netlink.NewHandleAt(h.host.NS)
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		eth0, err := nl.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, VxlanId: vni, Port: 8472, VtepDevIndex: eth0.Attrs().Index, SrcAddr: h.host.IP.AsSlice()}
		if err := nl.LinkAdd(vx); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(vx); err != nil {
			t.Fatal(err)
		}
	}
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation/troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	// refused runs a start that must be refused with want, saying each of
	// wantText, as troubleshooting.md quotes it (with the process holding
	// the port shown as nc (pid 4242)).
	refused := func(t *testing.T, h *node, run func() error, want error, wantText ...string) {
		t.Helper()
		err := run()
		if !errors.Is(err, want) {
			t.Fatalf("start = %v, want %v", err, want)
		}
		quoted := "Error: " + strings.ReplaceAll(err.Error(), fmt.Sprintf("%s (pid %d)", comm(t), os.Getpid()), "nc (pid 4242)") + "\n"
		if !strings.Contains(string(doc), quoted) {
			t.Errorf("troubleshooting.md does not quote %q", quoted)
		}
		for _, s := range wantText {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("start = %v, want it to say %q", err, s)
			}
		}
		if keys := published(t, c); len(keys) != 0 {
			t.Errorf("a refused start left keys in etcd: %q", keys)
		}
	}
	runOnce := func(h *node) func() error {
		return func() error { return Run(tctx(t), h.cfg) }
	}

	t.Run("flanneld's device without --adopt-flannel", func(t *testing.T) {
		h := c.addHost("h1", 1)
		addVxlan(t, h, "flannel.1", 1)
		refused(t, h, runOnce(h), ErrPortInUse, "UDP port 8472 is in use by VXLAN device flannel.1 (VNI 1)", "--adopt-flannel")
		// With --adopt-flannel it is taken over.
		h.cfg.AdoptFlannel = true
		h.start(t)
		if env := h.env(t); !env.Lease().IsValid() {
			t.Fatalf("no lease with --adopt-flannel: %+v", env)
		}
		h.stop()
		// Its own device from a run before is on the port too.
		h.start(t)
		h.env(t)
		h.stop()
		for _, dir := range []string{"/subnets/", "/nodes/"} {
			if _, err := c.reg.Client().Delete(tctx(t), etcdv3.DefaultPrefix+dir, clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("a UDP socket", func(t *testing.T) {
		h := c.addHost("h2", 2)
		var sock net.PacketConn
		if err := inNetns(h.host.NS, func() (err error) {
			sock, err = net.ListenPacket("udp4", "0.0.0.0:8472")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer sock.Close()
		refused(t, h, runOnce(h), ErrPortInUse, fmt.Sprintf("UDP port 8472 is in use by %s (pid %d)", comm(t), os.Getpid()), "`ss -ulpn`")
	})

	t.Run("without CAP_NET_ADMIN", func(t *testing.T) {
		h := c.addHost("h3", 3)
		errc := make(chan error, 1)
		go func() {
			// Capabilities are per thread: this one drops CAP_NET_ADMIN
			// from its effective set and is never unlocked, so it ends
			// with this goroutine and no other code runs on it.
			runtime.LockOSThread()
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				errc <- err
				return
			}
			data[0].Effective &^= 1 << unix.CAP_NET_ADMIN
			if err := unix.Capset(&hdr, &data[0]); err != nil {
				errc <- fmt.Errorf("drop CAP_NET_ADMIN: %w", err)
				return
			}
			errc <- Run(tctx(t), h.cfg)
		}()
		refused(t, h, func() error { return <-errc }, ErrNoNetAdmin, "overlayd needs CAP_NET_ADMIN", "AmbientCapabilities=CAP_NET_ADMIN")
	})
}

func comm(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A start that fails after claiming a new lease, before its data path is
// in place (here: the masquerade cannot be installed), releases that
// lease: no peer routes to a host that never served it. A lease the host
// held before is kept: its pods may hold addresses from it.
func TestFailedStartReleasesTheLeaseItClaimed(t *testing.T) {
	srv := etcdtest.Start(t)
	if _, err := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix).PutConfig(tctx(t),
		[]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	leases := func() []string {
		resp, err := srv.Client(t).Get(tctx(t), etcdv3.DefaultPrefix+"/subnets/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return keys
	}
	noMasq := errors.New("no nf_tables here")
	failing := func(c *Config) { c.Kernel.(*fakeKernel).masqErr = noMasq }
	wait := func(w *wiring) error {
		select {
		case err := <-w.done:
			w.done <- err // for the cleanup
			return err
		case <-time.After(testenv.Deadline(30 * time.Second)):
			t.Fatal("the daemon did not return")
			return nil
		}
	}

	var logs bytes.Buffer
	logged := func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) }
	if err := wait(startWiring(t, srv, failing, logged)); !errors.Is(err, noMasq) {
		t.Fatalf("start = %v, want %v", err, noMasq)
	}
	if keys := leases(); len(keys) != 0 {
		t.Errorf("a start that failed before its data path was in place left its new lease: %q", keys)
	}
	// configuration.md quotes the line.
	const released = "start-up failed before the data path was in place: released the lease it claimed"
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation/configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `msg="`+released+`"`) || !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), "`"+released+"`") {
		t.Errorf("want %q logged and quoted in configuration.md; logged:\n%s", released, logs.String())
	}

	w := startWiring(t, srv)
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	w.cancel()
	if err := wait(w); err != nil {
		t.Fatalf("stop: %v", err)
	}
	held := leases()
	if len(held) != 1 {
		t.Fatalf("leases after a good start: %q", held)
	}
	if err := wait(startWiring(t, srv, failing)); !errors.Is(err, noMasq) {
		t.Fatalf("restart = %v, want %v", err, noMasq)
	}
	if keys := leases(); !slices.Equal(keys, held) {
		t.Errorf("a failed restart changed the leases from %q to %q: the lease it held before must stay", held, keys)
	}

	// The network starts carrying IPv6 (a roll): the restart re-keys the
	// lease to add an IPv6 subnet, keeping its IPv4 subnet, and then
	// fails. The re-keyed lease is the one the host held, its pods hold
	// addresses from its IPv4 subnet: it stays.
	if _, err := etcdv3.NewRegistry(srv.Client(t), etcdv3.DefaultPrefix).PutConfig(tctx(t),
		[]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	withIPv6 := func(c *Config) {
		c.Kernel.(*fakeKernel).setIPv6("fd18::1")
	}
	if err := wait(startWiring(t, srv, withIPv6, failing)); !errors.Is(err, noMasq) {
		t.Fatalf("restart with IPv6 = %v, want %v", err, noMasq)
	}
	if keys := leases(); len(keys) != 1 || !strings.HasPrefix(keys[0], held[0]+"&fd00:10:244:") {
		t.Errorf("a failed restart that re-keyed the lease %q for IPv6 left %q: the re-keyed lease, with its IPv4 subnet, must stay", held, keys)
	}
}

// The walk up a network namespace owner's user namespaces closes every fd
// it opens: the one it started from, and each parent, also when it gives
// up (an inode it cannot read, a parent it may not open).
func TestUserNSAncestryClosesEveryFD(t *testing.T) {
	const self = 100
	for _, c := range []struct {
		name string
		// inodes of the namespaces from the owner (fd 3) up; 0: unreadable
		chain []uint64
		want  bool
	}{
		{"owned by this user namespace", []uint64{self}, true},
		{"owned by a descendant of this user namespace", []uint64{7, 8, self}, true},
		{"ancestry leaves this user namespace", []uint64{7, 8}, false},
		{"an inode that cannot be read", []uint64{7, 0, self}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			open := map[int]bool{3: true}
			sys := nsSyscalls{
				inode: func(fd int) (uint64, error) {
					if !open[fd] {
						t.Fatalf("fstat of fd %d, not open", fd)
					}
					if c.chain[fd-3] == 0 {
						return 0, unix.EIO
					}
					return c.chain[fd-3], nil
				},
				parent: func(fd int) (int, error) {
					if fd-3+1 >= len(c.chain) {
						return -1, unix.EPERM
					}
					open[fd+1] = true
					return fd + 1, nil
				},
				close: func(fd int) {
					if !open[fd] {
						t.Errorf("close of fd %d, not open", fd)
					}
					delete(open, fd)
				},
			}
			if got := userNSAncestry(3, self, sys); got != c.want {
				t.Errorf("userNSAncestry = %v, want %v", got, c.want)
			}
			if len(open) != 0 {
				t.Errorf("fds left open: %v", open)
			}
		})
	}
}
