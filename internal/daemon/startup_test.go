package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// logBuffer collects a daemon's JSON log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log lines as written.
func (b *logBuffer) lines(t *testing.T) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

// count returns how many lines have the message msg and contain every one
// of the substrings in with.
func (b *logBuffer) count(t *testing.T, msg string, with ...string) int {
	n := 0
	for _, l := range b.lines(t) {
		if !strings.Contains(l, `"msg":`+jsonString(msg)) {
			continue
		}
		all := true
		for _, w := range with {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// withLog makes n log JSON into the returned buffer (and to stderr with -v).
func (n *node) withLog(t *testing.T) *logBuffer {
	lb := &logBuffer{}
	n.cfg.Logger = slog.New(slog.NewJSONHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return lb
}

// withHealth gives n a health listener inside its namespace and returns
// a function that GETs a path from it.
func (n *node) withHealth(t *testing.T) func(path string) (int, string) {
	t.Helper()
	var ln net.Listener
	if err := lab.Do(n.host.NS, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n.cfg.HealthListener = ln
	client := nsHTTPClient(n.host.NS)
	base := "http://" + ln.Addr().String()
	return func(path string) (int, string) { return get(t, client, base+path) }
}

// waitReadyz waits until /readyz answers code with a body holding want.
func waitReadyz(t *testing.T, get func(string) (int, string), timeout time.Duration, code int, want string) {
	t.Helper()
	testenv.Eventually(t, timeout, fmt.Sprintf("/readyz %d naming %q", code, want), func() error {
		c, body := get("/readyz")
		if c != code || !strings.Contains(body, want) {
			return fmt.Errorf("got %d %q", c, body)
		}
		return nil
	})
}

// waitDone waits for n's Run to return and gives its result.
func (n *node) waitDone(t *testing.T, timeout time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-n.done:
		n.cancel = nil
		return err
	case <-time.After(testenv.Deadline(timeout)):
		t.Fatalf("%s: Run did not return within %s", what, testenv.Deadline(timeout))
		return nil
	}
}

// stopPromptly cancels n like SIGTERM and checks that Run returns nil.
func (n *node) stopPromptly(t *testing.T, phase string) {
	t.Helper()
	n.cancel()
	if err := n.waitDone(t, testenv.Slack, "signal "+phase); err != nil {
		t.Fatalf("signal %s: Run = %v, want a clean exit (nil)", phase, err)
	}
}

// Two hosts with one node name: the second exits non-zero with the
// documented advice once the first's liveness key has outlived its TTL —
// it does not retry forever — and readiness names the reason meanwhile.
// (Before the fix each attempt had 10 s while the wait needed 18 s, so the
// wait was cut short and retried for ever.)
func TestDuplicateNodeNameExitsWithAdvice(t *testing.T) {
	c := newCluster(t)
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.cfg.NodeName, h2.cfg.NodeName = "twin", "twin"
	h1.start(t)
	own := h1.env(t).Lease()
	get := h2.withHealth(t)
	h2.start(t)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, `startup: duplicate node ID: "twin" is held by a live overlayd at 198.18.0.1`)
	err := h2.waitDone(t, etcdv3.DefaultLivenessTTL+3*time.Second+testenv.Slack, "duplicate node name")
	if !errors.Is(err, etcdv3.ErrDuplicateNode) || !strings.Contains(err.Error(), "give every host its own --node-name") {
		t.Fatalf("second host with node name twin: Run = %v, want ErrDuplicateNode saying \"give every host its own --node-name\"", err)
	}
	l, gerr := c.reg.Get(context.Background(), subnet.Subnets{IPv4: own})
	if gerr != nil || l.Attrs.PublicIP != "198.18.0.1" {
		t.Errorf("the first host's lease was touched: %+v, %v", l, gerr)
	}
}

// A signal ends start-up cleanly at every phase it can wait in.
func TestSignalEndsEveryStartupPhaseCleanly(t *testing.T) {
	c := newCluster(t)

	// Waiting for etcd: nothing listens at the endpoint.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	h1 := c.addHost("h1", 1)
	h1.cfg.Etcd = etcdclient.Config{Endpoints: []string{"http://" + deadAddr}}
	get := h1.withHealth(t)
	h1.start(t)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, "startup: waiting to reach etcd at http://"+deadAddr)
	h1.stopPromptly(t, "while waiting for etcd")

	// Waiting for the network config: there is none.
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()
	raw, err := c.reg.Client().Get(ctx, c.reg.Keys.ConfigKey())
	if err != nil || len(raw.Kvs) != 1 {
		t.Fatalf("read config: %v", err)
	}
	if _, err := c.reg.Client().Delete(ctx, c.reg.Keys.ConfigKey()); err != nil {
		t.Fatal(err)
	}
	h2 := c.addHost("h2", 2)
	get = h2.withHealth(t)
	h2.start(t)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, "startup: waiting to read the network config: no network config at /coreos.com/network/config")
	h2.stopPromptly(t, "while waiting for the network config")
	if _, err := c.reg.Client().Put(ctx, c.reg.Keys.ConfigKey(), string(raw.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}

	// Waiting for another host's liveness key to expire.
	h3, h4 := c.addHost("h3", 3), c.addHost("h4", 4)
	h3.cfg.NodeName, h4.cfg.NodeName = "twin", "twin"
	h3.start(t)
	h3.env(t)
	get = h4.withHealth(t)
	h4.start(t)
	waitReadyz(t, get, testenv.Slack, http.StatusServiceUnavailable, "startup: duplicate node ID")
	h4.stopPromptly(t, "while waiting for a duplicate node ID's key")
}

// The start-up settings end once every plane has passed, whichever passes
// first and however often.
func TestFirstPassesCallsDoneOnceAfterEveryPlane(t *testing.T) {
	calls := 0
	hooks := firstPasses(2, func() { calls++ })
	hooks[1]()
	hooks[1]()
	if calls != 0 {
		t.Fatalf("done called %d times before the first plane passed", calls)
	}
	hooks[0]()
	hooks[0]()
	hooks[1]()
	if calls != 1 {
		t.Errorf("done called %d times after both planes passed (repeatedly); want once", calls)
	}
	for i, h := range firstPasses(2, nil) {
		if h != nil {
			t.Errorf("hook %d without done is set; want nil (no work per pass)", i)
		}
	}
}
