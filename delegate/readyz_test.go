package delegate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDaemonReady asks a real HTTP server on loopback, as overlayd serves
// /readyz: 200 is ready, 503 is not (with the daemon's reasons), and
// nothing listening is not.
func TestDaemonReady(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "not ready:\netcd session: lost\nlease: expired\n")
			return
		}
		fmt.Fprintln(w, "ready")
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	inv := NewExecInvoker(nil)
	ctx := context.Background()

	if err := inv.DaemonReady(ctx, addr); err != nil {
		t.Errorf("ready daemon: %v", err)
	}
	ready = false
	err := inv.DaemonReady(ctx, addr)
	if !errors.Is(err, ErrDaemonNotReady) || !strings.Contains(err.Error(), "503") ||
		!strings.Contains(err.Error(), "etcd session: lost lease: expired") {
		t.Errorf("not-ready daemon: %v", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if err := inv.DaemonReady(ctx, closed); !errors.Is(err, ErrDaemonNotReady) || !strings.Contains(err.Error(), closed) {
		t.Errorf("no daemon: %v", err)
	}
}

func TestReadyzAnswer(t *testing.T) {
	for _, tc := range []struct {
		answer string
		ok     bool
	}{
		{"HTTP/1.0 200 OK\r\n\r\nready\n", true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nready\n", true},
		{"HTTP/1.0 503 Service Unavailable\r\n\r\nnot ready\n", false},
		{"SSH-2.0-OpenSSH\r\n", false},
		{"", false},
	} {
		err := readyzAnswer("127.0.0.1:9436", strings.NewReader(tc.answer))
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrDaemonNotReady) {
			t.Errorf("answer %q: %v, want ok=%v", tc.answer, err, tc.ok)
		}
	}
}
