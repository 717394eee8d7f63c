package etcdclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
)

// TestProbeFindsNoFaultInHealthyEndpoints: the probe must not invent
// failures, and must finish on its own (by the server's HTTP/2 answer), not
// by running out of time.
func TestProbeFindsNoFaultInHealthyEndpoints(t *testing.T) {
	t.Parallel()
	pki := etcdtest.NewPKI(t)
	plain := etcdtest.Start(t)
	serverTLS := etcdtest.Start(t, pki.ServerTLS())
	mutual := etcdtest.Start(t, pki.MutualTLS())
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"plaintext", Config{Endpoints: []string{plain.Endpoint}}},
		{"server TLS", Config{Endpoints: []string{serverTLS.Endpoint}, CACert: pki.CACert}},
		{"mutual TLS", Config{Endpoints: []string{mutual.Endpoint}, CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey}},
		{"several", Config{Endpoints: []string{serverTLS.Endpoint, mutual.Endpoint}, CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			found := tc.c.probeAll(ctx)
			if ctx.Err() != nil {
				t.Fatalf("probe ran until its deadline")
			}
			if len(found) != len(tc.c.Endpoints) {
				t.Fatalf("probe gave %d results for %d endpoints", len(found), len(tc.c.Endpoints))
			}
			for i, e := range found {
				if e != nil {
					t.Errorf("endpoint %s: probe found %v", tc.c.Endpoints[i], e)
				}
			}
		})
	}
}

// TestCheckGivesUpWithItsCaller: a cancelled caller gets its cancellation,
// not a diagnosis of an unreachable etcd.
func TestCheckGivesUpWithItsCaller(t *testing.T) {
	t.Parallel()
	c := Config{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.diagnose(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("diagnose after cancel: %v; want context.Canceled only", err)
	}
}
