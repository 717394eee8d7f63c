package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/fakesource"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// The daemon driven by a lease source that is not etcd (Config.Source),
// with a fake kernel: what the daemon relies on is the subnet.Source
// contract alone. A saved set that is behind holds readiness, and the
// lease keeping, until a batch says it caught up; the watch's batches
// program and remove peers; an invalid value, named as the source names
// it (not as an etcd key), turns its peer off; shutdown ends the watch and
// closes the source the daemon was given.
func TestWiringFakeSourceStartBatchesInvalidCatchUpShutdown(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	own := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}
	nodeB := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.2.0/24")}
	const behind = "catching up with the fake store"
	src := fakesource.New(cfg, own, subnet.Snapshot{Revision: 1, Saved: true, Head: 5, Behind: behind,
		Leases: []subnet.Lease{lease("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02", 1)}})
	w := startWiring(t, nil, func(c *Config) { c.Source = src; c.PublicIP = netip.MustParseAddr("198.18.0.1") })
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(testenv.Slack))
	defer cancel()

	// Catching up: not ready, and the lease not kept yet.
	testenv.Eventually(t, testenv.Slack, "readiness to say it catches up", func() error {
		if err := w.ready(); err == nil || !strings.Contains(err.Error(), behind) {
			return fmt.Errorf("readyz: %v", err)
		}
		return nil
	})
	select {
	case <-src.Keeping():
		t.Fatal("Keep runs before the watch caught up")
	default:
	}
	if err := src.Send(ctx, subnet.Batch{Revision: 5, CaughtUp: true, Events: []subnet.Event{
		{Type: subnet.Added, Lease: lease("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03", 4)}}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, testenv.Slack, "the daemon to become ready", w.ready)
	select {
	case <-src.Keeping():
	case <-ctx.Done():
		t.Fatal("Keep did not start once the watch caught up")
	}
	if !w.routed("10.244.2.0/24") || !w.routed("10.244.3.0/24") {
		t.Fatal("ready, but the snapshot's peer or the catch-up's is not programmed")
	}
	if h := src.Host(); h.PublicIP != netip.MustParseAddr("198.18.0.1") || len(h.Attrs.BackendData) == 0 {
		t.Errorf("the host claimed: %+v; want this host's public IP and its VXLAN data", h)
	}

	// Readiness judges the host's liveness in the source under the
	// source's name, not etcd's.
	var st Status
	if err := getJSON(w.health+"/status", &st); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range st.Conditions {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, "fake") || slices.Contains(names, "etcd") {
		t.Errorf("conditions %v: want the source's (fake), not etcd's", names)
	}

	// A batch removes a peer; an invalid value, named by the source, turns
	// another off.
	if err := src.Send(ctx, subnet.Batch{Revision: 6, Events: []subnet.Event{{Type: subnet.Removed, Lease: subnet.Lease{Subnet: netip.MustParsePrefix("10.244.3.0/24")}}}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a removed peer's route to go", func() bool { return !w.routed("10.244.3.0/24") })
	if err := src.Send(ctx, subnet.Batch{Revision: 7, Invalid: []subnet.Invalid{{Key: "node-b", Subnets: nodeB, ModRevision: 7, Err: errors.New("bad annotation")}}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "node-b's route to go once its value is invalid", func() bool { return !w.routed("10.244.2.0/24") })

	// Shutdown: the watch ends, the source the daemon was given is closed
	// once, and the lease it kept is not released.
	w.stop(t)
	if n := src.Closed(); n != 1 {
		t.Errorf("the source was closed %d times, want once", n)
	}
	if n := src.Watching(); n != 0 {
		t.Errorf("%d watch(es) still running after Run returned", n)
	}
	if n := src.Released(); n != 0 {
		t.Errorf("a kept lease was released at shutdown (%d)", n)
	}
	testenv.Eventually(t, testenv.Slack, "every goroutine of the daemon to end", leftoverGoroutines)
}

// A lease source whose Connect fails with an error it calls fatal (etcd:
// bad client settings) ends the start at once with that error, instead of
// retrying it for ever.
func TestWiringFakeSourceFatalConnectEndsTheStart(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	src := fakesource.New(cfg, subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.1.0/24")}, subnet.Snapshot{})
	src.ConnectErr = fmt.Errorf("%w: the store's address is malformed", fakesource.ErrFatal)
	w := startWiring(t, nil, func(c *Config) { c.Source = src; c.PublicIP = netip.MustParseAddr("198.18.0.1") })
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		if !errors.Is(err, fakesource.ErrFatal) {
			t.Fatalf("Run returned %v, want the source's fatal error", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("a fatal error of Connect is retried: Run did not return")
	}
	if n := src.Closed(); n != 1 {
		t.Errorf("the source was closed %d times, want once (the daemon owns it, reached or not)", n)
	}
}
