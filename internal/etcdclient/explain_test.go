package etcdclient

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every etcd refusal becomes one line in the user's words that says what
// to do; the gRPC or etcdserver text is not shown, but errors.Is still
// matches the etcd error (issue 13: "never raw gRPC status text").
func TestExplainServerSpeaksTheUsersWords(t *testing.T) {
	c := Config{Endpoints: []string{"https://etcd-1:2379"}, Username: "ops"}
	tests := []struct {
		err  error
		want string
		kind error
	}{
		{rpctypes.ErrAuthFailed, `refused user "ops" (wrong user name or password): check --user and --password`, ErrAuth},
		{rpctypes.ErrUserEmpty, "requires authentication: set --user name:password", ErrAuth},
		{rpctypes.ErrPermissionDenied, `denied user "ops" access: grant its role readwrite`, ErrAuth},
		{rpctypes.ErrNoLeader, "etcd at https://etcd-1:2379 has no leader: a majority of its members must run", nil},
		{rpctypes.ErrLeaderChanged, "has no leader", nil},
		{rpctypes.ErrTimeout, "timed out handling the request", nil},
		{rpctypes.ErrNoSpace, "is out of space (NOSPACE alarm)", nil},
		{rpctypes.ErrTooManyRequests, "is too busy", nil},
		{rpctypes.ErrRequestTooLarge, "too large", nil},
		{rpctypes.ErrNotCapable, "cannot serve requests", nil},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max"), "refused the request: grpc: received message larger than max: check etcd's logs", nil},
		{rpctypes.ErrKeyNotFound, "refused the request: key not found", nil},
	}
	for _, tt := range tests {
		wrapped := fmt.Errorf("read /coreos.com/network/config: %w", tt.err)
		got := c.explainServer(wrapped)
		msg := got.Error()
		if !strings.Contains(msg, tt.want) {
			t.Errorf("%v: got %q, want it to contain %q", tt.err, msg, tt.want)
		}
		if strings.Contains(msg, "rpc error") || strings.Contains(msg, "etcdserver:") || strings.Contains(msg, "code =") || strings.Contains(msg, "\n") {
			t.Errorf("%v: %q shows etcd's raw text or is not one line", tt.err, msg)
		}
		if !errors.Is(got, tt.err) || tt.kind != nil && !errors.Is(got, tt.kind) {
			t.Errorf("%v: %q no longer matches the etcd error or its kind", tt.err, msg)
		}
	}
	if other := errors.New("no such lease"); c.explainServer(other) != other {
		t.Error("an error etcd did not send was changed")
	}
}
