package runtimee2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// libcniBefore12Newest is the newest CNI spec version libcni before v1.2
// knows (podman 4 and containerd 1.6 are built with v1.1.2).
const libcniBefore12Newest = "1.0.0"

// probeTimeout bounds one ping, TCP exchange or HTTP fetch.
const probeTimeout = 3 * time.Second

// hostPort is the port podman publishes on h2 (-p) for the httpd in b.
const hostPort = 18080

func (s *suite) testPodman(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(3*time.Minute))
	defer cancel()
	h1, h2 := s.hosts[0], s.hosts[1]
	p1, p2 := newPodman(t, h1, s.cniBin), newPodman(t, h2, s.cniBin)
	for _, p := range []*podman{p1, p2} {
		t.Cleanup(func() {
			if out, err := p.run(context.Background(), "rm", "--all", "--force", "--time", "0"); err != nil {
				t.Errorf("podman rm --all on %s: %v (%s)", p.h.Name, err, out)
			}
		})
		p.must(t, ctx, "import", "--change", `CMD ["/bin/sleep","3600"]`, "--change", "ENV PATH=/bin", s.img.rootfs, imageName)
	}
	// run starts a container named name (args: image and command).
	run := func(p *podman, name string, args ...string) container {
		t.Helper()
		p.must(t, ctx, append([]string{"run", "--detach", "--pull=never", "--network=overlay", "--name", name}, args...)...)
		return p.inspect(t, ctx, name)
	}

	a := run(p1, "a", imageName)
	b := run(p2, "b", "--publish", fmt.Sprintf("%d:80", hostPort), imageName, "httpd", "-f", "-p", "80", "-h", "/www")
	// podman 4's libcni knows spec versions up to 1.0.0: the shipped
	// conflist's cniVersion, not 1.1.0 from its cniVersions.
	if v := h1.cachedVersion(t, a.ID); v != libcniBefore12Newest {
		t.Errorf("podman ran overlay-cni at cniVersion %s, want %s", v, libcniBefore12Newest)
	}
	for _, c := range []struct {
		h *host
		c container
	}{{h1, a}, {h2, b}} {
		if lease := lease(t, c.h); !lease.Contains(c.c.IP) {
			t.Fatalf("container on %s got %s, outside its lease %s", c.h.Name, c.c.IP, lease)
		}
	}

	t.Run("cross-host ping and TCP with real addresses", func(t *testing.T) {
		if out, err := p1.run(ctx, "exec", "a", "ping", "-c", "1", "-W", "3", b.IP.String()); err != nil {
			t.Errorf("a -> b ping: %v\n%s", err, out)
		}
		if out, err := p2.run(ctx, "exec", "b", "ping", "-c", "1", "-W", "3", a.IP.String()); err != nil {
			t.Errorf("b -> a ping: %v\n%s", err, out)
		}
		// A responder in b's namespace answers each connection with the
		// source address it saw; a's own nc connects to it.
		stop := serveIn(t, b, 7777)
		defer stop()
		seen, err := p1.run(ctx, "exec", "a", "nc", "-w", "3", b.IP.String(), "7777")
		if err != nil || strings.TrimSpace(seen) != a.IP.String() {
			t.Errorf("a -> b TCP: b saw %q (%v), want a's address %s (no NAT between pods)", seen, err, a.IP)
		}
	})

	t.Run("published port through portmap", func(t *testing.T) {
		// From the other host, to h2's own address: portmap's DNAT on h2.
		body, err := httpGet(h1.NS, netip.AddrPortFrom(h2.IP, hostPort))
		if err != nil || body != indexHTML {
			t.Errorf("GET http://%s:%d/ from %s = %q, %v; want %q", h2.IP, hostPort, h1.Name, body, err, indexHTML)
		}
	})

	t.Run("stop, start, restart", func(t *testing.T) {
		p2.must(t, ctx, "stop", "--time", "0", "b")
		if left := h2.leftovers(t, nil); len(left) != 0 {
			t.Errorf("after podman stop: %v", left)
		}
		p2.must(t, ctx, "start", "b")
		b2 := p2.inspect(t, ctx, "b")
		testenv.Eventually(t, probeTimeout+testenv.Slack, "httpd of the restarted b through -p", func() error {
			body, err := httpGet(h1.NS, netip.AddrPortFrom(h2.IP, hostPort))
			if err == nil && body != indexHTML {
				err = fmt.Errorf("body %q", body)
			}
			return err
		})
		p1.must(t, ctx, "restart", "--time", "0", "a")
		a2 := p1.inspect(t, ctx, "a")
		if out, err := p1.run(ctx, "exec", "a", "ping", "-c", "1", "-W", "3", b2.IP.String()); err != nil {
			t.Errorf("restarted a -> started b: %v\n%s", err, out)
		}
		t.Logf("a %s -> %s, b %s -> %s", a.IP, a2.IP, b.IP, b2.IP)
	})

	t.Run("rm releases everything", func(t *testing.T) {
		p1.must(t, ctx, "rm", "--force", "--time", "0", "a")
		p2.must(t, ctx, "rm", "--force", "--time", "0", "b")
		for _, h := range s.hosts {
			if left := h.leftovers(t, nil); len(left) != 0 {
				t.Errorf("%s after podman rm: %v", h.Name, left)
			}
		}
	})

	t.Run("20 parallel runs and removals", func(t *testing.T) {
		const n = 20
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, errs[i] = p1.run(ctx, "run", "--detach", "--pull=never", "--network=overlay", "--name", fmt.Sprintf("par%d", i), imageName)
			})
		}
		wg.Wait()
		seen := map[netip.Addr]bool{}
		for i, err := range errs {
			if err != nil {
				t.Errorf("run par%d: %v", i, err)
				continue
			}
			c := p1.inspect(t, ctx, fmt.Sprintf("par%d", i))
			if seen[c.IP] || !lease(t, h1).Contains(c.IP) {
				t.Errorf("par%d got %s: duplicate or outside the lease", i, c.IP)
			}
			seen[c.IP] = true
		}
		for i := range n {
			wg.Go(func() {
				_, errs[i] = p1.run(ctx, "rm", "--force", "--time", "0", fmt.Sprintf("par%d", i))
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("rm par%d: %v", i, err)
			}
		}
		if left := h1.leftovers(t, nil); len(left) != 0 {
			t.Errorf("after 20 parallel removals: %v", left)
		}
	})

	t.Run("overlayd stopped, then subnet.env removed", func(t *testing.T) {
		if err := h1.Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := h1.Start(); err != nil {
				t.Fatal(err)
			}
			labtest.WaitReady(t, h1.Node)
		}()
		// The data path and subnet.env stay: new containers still start.
		c := run(p1, "nodaemon", imageName)
		if !lease(t, h1).Contains(c.IP) {
			t.Errorf("container started while overlayd was stopped got %s", c.IP)
		}
		if err := os.Remove(h1.SubnetFile); err != nil {
			t.Fatal(err)
		}
		out, err := p1.run(ctx, "run", "--detach", "--pull=never", "--network=overlay", "--name", "nolease", imageName)
		if err == nil || !strings.Contains(err.Error(), "subnet file") {
			t.Errorf("podman run without subnet.env = %v (%s), want overlay-cni's error naming the subnet file", err, out)
		}
		_, _ = p1.run(ctx, "rm", "--force", "--time", "0", "nolease")
		// DEL needs neither overlayd nor subnet.env: the cache replays.
		p1.must(t, ctx, "rm", "--force", "--time", "0", "nodaemon")
		if left := h1.leftovers(t, nil); len(left) != 0 {
			t.Errorf("after removing the containers without overlayd and subnet.env: %v", left)
		}
	})
}

// lease is the host's current lease, from its subnet.env.
func lease(t *testing.T, h *host) netip.Prefix {
	t.Helper()
	p, err := h.Lease()
	if err != nil {
		t.Fatalf("%s: %v", h.Name, err)
	}
	return p
}

// serveIn starts a lab Responder on c's address inside c's network
// namespace and returns its stop function.
func serveIn(t *testing.T, c container, port uint16) func() {
	t.Helper()
	ns, err := netns.GetFromPath(c.Sandbox)
	if err != nil {
		t.Fatalf("open %s: %v", c.Sandbox, err)
	}
	r, err := lab.Serve(ns, c.IP, port)
	if err != nil {
		ns.Close()
		t.Fatal(err)
	}
	return func() { r.Close(); ns.Close() }
}

// httpGet fetches / from dst out of namespace ns (HTTP/1.0, body only).
func httpGet(ns netns.NsHandle, dst netip.AddrPort) (string, error) {
	conn, err := lab.DialTCP(ns, dst, probeTimeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
		return "", err
	}
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.Contains(status, " 200") {
		return "", fmt.Errorf("status %q", strings.TrimSpace(status))
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(line) == "" {
			break
		}
	}
	body, err := io.ReadAll(br)
	return string(body), err
}
