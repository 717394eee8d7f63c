package etcdtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func TestTLSServers(t *testing.T) {
	t.Parallel()
	pki := NewPKI(t)
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"server TLS", pki.ServerTLS()},
		{"mutual TLS", pki.MutualTLS()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, tc.opt, FastPasswords())
			if !strings.HasPrefix(s.Endpoint, "https://") {
				t.Fatalf("endpoint %s is not https", s.Endpoint)
			}
			cli := s.TLSClient(t, pki, "", "")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := cli.Put(ctx, "k", "v"); err != nil {
				t.Fatalf("put over TLS: %v", err)
			}
			EnableAuth(t, cli, "rootpw")
			root := s.TLSClient(t, pki, "root", "rootpw")
			AddUser(t, root, "alice", "alicepw", "/alice/")
			alice := s.TLSClient(t, pki, "alice", "alicepw")
			if _, err := alice.Put(ctx, "/alice/x", "1"); err != nil {
				t.Fatalf("alice put in her prefix: %v", err)
			}
			if _, err := alice.Put(ctx, "/bob/x", "1"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
				t.Fatalf("alice put outside her prefix: err = %v, want %v", err, rpctypes.ErrPermissionDenied)
			}
		})
	}
}
