package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// nsHTTPClient makes requests from inside ns (where the daemon listens on
// its own loopback).
func nsHTTPClient(ns netns.NsHandle) *http.Client {
	return &http.Client{Timeout: testenv.Deadline(5 * time.Second), Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = lab.Do(ns, func() error {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestReadinessFollowsEachCondition(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	h1.withHealth(t)
	// Short TTLs, so that an etcd outage shows soon, but long enough that a
	// keepalive delayed by a busy machine never lets them lapse while etcd
	// is up (the client renews every TTL/3).
	const livenessTTL, leaseTTL = 6 * time.Second, 9 * time.Second
	h1.cfg.LivenessTTL = livenessTTL
	h1.cfg.LeaseTTL = leaseTTL
	base := "http://" + h1.cfg.HealthListener.Addr().String()
	client := nsHTTPClient(h1.host.NS)

	h1.start(t)
	if code, body := get(t, client, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	waitFor(t, testenv.Slack, "/readyz 200", func() bool { code, _ := get(t, client, base+"/readyz"); return code == http.StatusOK })
	env := h1.env(t)

	_, body := get(t, client, base+"/status")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	if !st.Ready || st.Node != "h1" || st.Subnet != env.Lease().String() || st.Device != "overlay.1" || st.MTU != 1450 || st.PublicIP != "198.18.0.1" {
		t.Errorf("/status = %+v", st)
	}
	_, metrics := get(t, client, base+"/metrics")
	for _, want := range []string{"overlay_ready 1", "overlay_device_present 1", "overlay_reconcile_passes_total", "overlay_lease_expiry_seconds", "overlay_event_to_programmed_seconds_bucket"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// Device and reconcile: take the underlay away (rename eth0); the
	// backend can no longer ensure its device. Give it back: ready again.
	rename := func(from, to string) {
		h, err := netlink.NewHandleAt(h1.host.NS)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		l, err := h.LinkByName(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetName(l, to); err != nil {
			t.Fatal(err)
		}
	}
	rename("eth0", "eth0-away")
	waitFor(t, testenv.Slack, "/readyz 503 naming the device", func() bool {
		code, body := get(t, client, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "device:") && strings.Contains(body, "reconcile:")
	})
	rename("eth0-away", "eth0")
	// The backend retries its device with a backoff of at most 10 s.
	waitFor(t, 10*time.Second+testenv.Slack, "/readyz 200 again", func() bool { code, _ := get(t, client, base+"/readyz"); return code == http.StatusOK })

	// etcd and lease: stop etcd. The liveness key lapses first, then the
	// lease can no longer be renewed.
	c.srv.Close()
	waitFor(t, leaseTTL+testenv.Slack, "/readyz 503 naming etcd and the lease", func() bool {
		code, body := get(t, client, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd: etcd session lost") && strings.Contains(body, "lease: lease expired")
	})
	_, metrics = get(t, client, base+"/metrics")
	if !strings.Contains(metrics, "overlay_ready 0") {
		t.Errorf("/metrics does not say overlay_ready 0 while not ready")
	}
	// The data path stays: the device is still there and healthz still 200.
	if code, _ := get(t, client, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d during an etcd outage, want 200", code)
	}
}
