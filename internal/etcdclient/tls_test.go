package etcdclient_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// dialTimeout bounds every connection attempt in these tests; failures
// that the probe can pin down must come back well before it.
const dialTimeout = 3 * time.Second

func connect(t *testing.T, c etcdclient.Config) (*clientv3.Client, error) {
	t.Helper()
	if c.DialTimeout == 0 {
		c.DialTimeout = dialTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.DialTimeout+testenv.Deadline(testenv.Slack))
	defer cancel()
	start := time.Now()
	cli, err := etcdclient.Connect(ctx, c)
	// Bounded, not fast: a Connect that ignored its dial timeout would hang
	// until ctx (twice the dial timeout) or forever.
	if d := time.Since(start); d > testenv.Deadline(c.DialTimeout+testenv.Slack) {
		t.Errorf("Connect took %s; want it bounded by the dial timeout %s", d, c.DialTimeout)
	}
	if cli != nil {
		t.Cleanup(func() { _ = cli.Close() })
	}
	return cli, err
}

func mustConnect(t *testing.T, c etcdclient.Config) *clientv3.Client {
	t.Helper()
	cli, err := connect(t, c)
	if err != nil {
		t.Fatalf("Connect(%v): %v", c, err)
	}
	return cli
}

// putGet proves cli works end to end.
func putGet(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if _, err := cli.Put(ctx, key, "v"); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get %s = %v, %v; want v", key, resp, err)
	}
}

// wantErr checks err against every target with errors.Is and that its text
// names what to fix (the message is what an operator reads).
func wantErr(t *testing.T, err error, targets []error, mention ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error; want %v", targets)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("error %q is not %v", err, target)
		}
	}
	for _, m := range mention {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
}

func hostPort(endpoint string) string {
	_, hp, _ := strings.Cut(endpoint, "://")
	return hp
}

// TestServerTLS: etcd serves TLS and does not ask for client certificates.
func TestServerTLS(t *testing.T) {
	t.Parallel()
	pki := etcdtest.NewPKI(t)
	wrong := etcdtest.NewPKI(t)
	srv := etcdtest.Start(t, pki.ServerTLS())

	t.Run("CA only connects", func(t *testing.T) {
		putGet(t, mustConnect(t, etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert}), "ca-only")
	})
	t.Run("by host name in the certificate", func(t *testing.T) {
		ep := "https://localhost:" + strings.Split(srv.Endpoint, ":")[2]
		putGet(t, mustConnect(t, etcdclient.Config{Endpoints: []string{ep}, CACert: pki.CACert}), "by-name")
	})
	t.Run("bare host:port uses TLS because a CA is set", func(t *testing.T) {
		putGet(t, mustConnect(t, etcdclient.Config{Endpoints: []string{hostPort(srv.Endpoint)}, CACert: pki.CACert}), "bare")
	})
	t.Run("wrong CA fails fast naming the unknown authority", func(t *testing.T) {
		c := etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: wrong.CACert}
		start := time.Now()
		_, err := connect(t, c)
		if d := time.Since(start); d > dialTimeout/2 {
			t.Errorf("Connect took %s; want the probe to cut the wait short", d)
		}
		wantErr(t, err, []error{etcdclient.ErrTLS, etcdclient.ErrConfig},
			"TLS handshake with "+srv.Endpoint, "certificate signed by unknown authority", "--cacert "+wrong.CACert)
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("error %q does not wrap x509.UnknownAuthorityError", err)
		}
		var epErr *etcdclient.EndpointError
		if !errors.As(err, &epErr) || epErr.Endpoint != srv.Endpoint {
			t.Errorf("error %q is not an EndpointError for %s", err, srv.Endpoint)
		}
	})
	t.Run("wrong CA with a user fails fast in New", func(t *testing.T) {
		// With a user, New authenticates at once; it must not hang for the
		// dial timeout nor hide the cause.
		c := etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: wrong.CACert, Username: "root", Password: "pw", DialTimeout: dialTimeout}
		start := time.Now()
		cli, err := etcdclient.New(c)
		if err == nil {
			_ = cli.Close()
		}
		if d := time.Since(start); d > dialTimeout/2 {
			t.Errorf("New took %s; want the probe to cut the wait short", d)
		}
		wantErr(t, err, []error{etcdclient.ErrTLS}, "certificate signed by unknown authority")
	})
	t.Run("no CA: system roots do not trust etcd", func(t *testing.T) {
		_, err := connect(t, etcdclient.Config{Endpoints: []string{srv.Endpoint}})
		wantErr(t, err, []error{etcdclient.ErrTLS}, "certificate signed by unknown authority", "--cacert")
	})
	t.Run("later request explained", func(t *testing.T) {
		// A client from New connects lazily; its requests only time out.
		// Explain recovers the reason.
		c := etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: wrong.CACert, DialTimeout: dialTimeout}
		cli, err := etcdclient.New(c)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err = cli.Get(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("get with the wrong CA: %v; want a deadline error", err)
		}
		wantErr(t, etcdclient.Explain(context.Background(), c, err), []error{etcdclient.ErrTLS}, "certificate signed by unknown authority")
	})
	t.Run("plaintext endpoint to a TLS server", func(t *testing.T) {
		_, err := connect(t, etcdclient.Config{Endpoints: []string{"http://" + hostPort(srv.Endpoint)}})
		wantErr(t, err, []error{etcdclient.ErrTLS}, "TLS only", "https://")
	})
	t.Run("TLS endpoint to a plaintext server", func(t *testing.T) {
		plain := etcdtest.Start(t)
		ep := "https://" + hostPort(plain.Endpoint)
		_, err := connect(t, etcdclient.Config{Endpoints: []string{ep}, CACert: pki.CACert})
		// Retryable (a restarting server hangs up too), but it says what to check.
		wantErr(t, err, []error{etcdclient.ErrUnreachable}, "TLS handshake with "+ep, "http://")
	})
	t.Run("one bad endpoint of two", func(t *testing.T) {
		dead := closedPort(t)
		putGet(t, mustConnect(t, etcdclient.Config{Endpoints: []string{"https://" + dead, srv.Endpoint}, CACert: pki.CACert}), "one-of-two")
	})
}

// TestMutualTLS: etcd requires a client certificate from its CA.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	pki := etcdtest.NewPKI(t)
	other := etcdtest.NewPKI(t)
	srv := etcdtest.Start(t, pki.MutualTLS())

	t.Run("with client certificate", func(t *testing.T) {
		putGet(t, mustConnect(t, etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey}), "mtls")
	})
	t.Run("without client certificate", func(t *testing.T) {
		start := time.Now()
		_, err := connect(t, etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert})
		if d := time.Since(start); d > dialTimeout/2 {
			t.Errorf("Connect took %s; want the probe to cut the wait short", d)
		}
		wantErr(t, err, []error{etcdclient.ErrTLS, etcdclient.ErrConfig}, "certificate required", "--cert and --key")
		var alert tls.AlertError
		if !errors.As(err, &alert) || alert != 116 {
			t.Errorf("error %q does not wrap the certificate_required alert (116)", err)
		}
	})
	t.Run("client certificate of another CA", func(t *testing.T) {
		_, err := connect(t, etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert, Cert: other.ClientCert, Key: other.ClientKey})
		wantErr(t, err, []error{etcdclient.ErrTLS}, "--cert "+other.ClientCert, "trusted-ca-file")
	})
	t.Run("later request without certificate explained", func(t *testing.T) {
		c := etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert, DialTimeout: dialTimeout}
		cli, err := etcdclient.New(c)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err = cli.Get(ctx, "k")
		wantErr(t, etcdclient.Explain(context.Background(), c, err), []error{etcdclient.ErrTLS}, "certificate required", "--cert and --key")
	})
}

// TestPasswordAuth: etcd (over server TLS) with authentication enabled.
func TestPasswordAuth(t *testing.T) {
	t.Parallel()
	const rootPassword = "root-Pa55-secret"
	const alicePassword = "alice-Pa55-secret"
	pki := etcdtest.NewPKI(t)
	srv := etcdtest.Start(t, pki.ServerTLS(), etcdtest.FastPasswords())
	admin := srv.TLSClient(t, pki, "", "")
	etcdtest.EnableAuth(t, admin, rootPassword)
	root := srv.TLSClient(t, pki, "root", rootPassword)
	etcdtest.AddUser(t, root, "alice", alicePassword, "/overlay/")
	base := etcdclient.Config{Endpoints: []string{srv.Endpoint}, CACert: pki.CACert}
	with := func(user string) etcdclient.Config {
		c := base
		c.Username, c.Password = etcdclient.ParseUser(user)
		return c
	}
	var errs []error // every failure, checked for leaked passwords at the end

	t.Run("root", func(t *testing.T) {
		putGet(t, mustConnect(t, with("root:"+rootPassword)), "root-key")
	})
	t.Run("user with a key prefix", func(t *testing.T) {
		// Check passes although alice may not read its probe key.
		c := with("alice:" + alicePassword)
		cli := mustConnect(t, c)
		putGet(t, cli, "/overlay/alice")
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		defer cancel()
		_, err := cli.Put(ctx, "/elsewhere", "v")
		err = etcdclient.Explain(ctx, c, err)
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrAuth, rpctypes.ErrPermissionDenied}, `user "alice"`, "readwrite")
	})
	t.Run("no credentials", func(t *testing.T) {
		_, err := connect(t, base)
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrAuth, etcdclient.ErrConfig, rpctypes.ErrUserEmpty}, "requires authentication", "--user")
	})
	t.Run("wrong password", func(t *testing.T) {
		_, err := connect(t, with("alice:"+rootPassword))
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrAuth, etcdclient.ErrConfig, rpctypes.ErrAuthFailed}, `user "alice"`, "--password")
	})
	t.Run("unknown user", func(t *testing.T) {
		_, err := connect(t, with("mallory:"+alicePassword))
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrAuth, rpctypes.ErrAuthFailed}, `user "mallory"`)
	})
	t.Run("wrong CA with a password", func(t *testing.T) {
		c := with("root:" + rootPassword)
		c.CACert = etcdtest.NewPKI(t).CACert
		_, err := connect(t, c)
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrTLS}, "unknown authority")
	})
	t.Run("plaintext endpoint", func(t *testing.T) {
		c := with("root:" + rootPassword)
		c.Endpoints, c.CACert = []string{"http://" + hostPort(srv.Endpoint)}, ""
		_, err := connect(t, c)
		errs = append(errs, err)
		wantErr(t, err, []error{etcdclient.ErrTLS}, "TLS only")
	})
	t.Run("no error shows a password", func(t *testing.T) {
		for _, err := range errs {
			if err == nil {
				continue
			}
			for _, pw := range []string{rootPassword, alicePassword} {
				if strings.Contains(err.Error(), pw) {
					t.Errorf("error %q contains a password", err)
				}
			}
		}
	})
}

// TestNothingInPlaintextWhenTLSIsSet: with TLS configured, every connection
// the client (and its probe) opens starts with a TLS handshake record, and
// the password never crosses the wire in the clear. http:// endpoints are
// refused before any connection is made.
func TestNothingInPlaintextWhenTLSIsSet(t *testing.T) {
	t.Parallel()
	const password = "never-on-the-wire"
	pki := etcdtest.NewPKI(t)
	spy := newSpy(t)

	for _, eps := range [][]string{
		{"http://" + spy.addr},
		{"HTTP://" + spy.addr},
		{"https://" + closedPort(t), "http://" + spy.addr},
	} {
		_, err := connect(t, etcdclient.Config{Endpoints: eps, CACert: pki.CACert, Username: "root", Password: password})
		wantErr(t, err, []error{etcdclient.ErrConfig}, "https://")
	}
	if n := spy.connections(); n != 0 {
		t.Fatalf("refused http:// endpoints still opened %d connections", n)
	}

	// A bare host:port gets TLS because a CA is set. The spy hangs up after
	// the first bytes, so the handshake fails and New returns.
	_, err := connect(t, etcdclient.Config{Endpoints: []string{spy.addr}, CACert: pki.CACert, Username: "root", Password: password})
	wantErr(t, err, nil, "TLS handshake with "+spy.addr)
	got := spy.firstBytes()
	spoke := 0
	for i, b := range got {
		if len(b) == 0 {
			continue // a dial given up before sending anything: nothing crossed the wire
		}
		spoke++
		// A TLS handshake record starts 0x16 0x03.
		if len(b) < 2 || b[0] != 0x16 || b[1] != 0x03 {
			t.Errorf("connection %d started with %q, not a TLS handshake record", i, b)
		}
		if bytes.Contains(b, []byte(password)) {
			t.Errorf("connection %d carried the password in the clear", i)
		}
	}
	if spoke == 0 {
		t.Fatal("the client never sent anything to the spy")
	}
}

// spy is a TCP listener that records the first bytes of each connection
// and hangs up.
type spy struct {
	addr string
	mu   sync.Mutex
	got  [][]byte
	n    int
}

func newSpy(t *testing.T) *spy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &spy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.n++
			s.mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(dialTimeout))
				buf := make([]byte, 512)
				n, _ := io.ReadAtLeast(conn, buf, 5)
				s.mu.Lock()
				s.got = append(s.got, buf[:n])
				s.mu.Unlock()
			})
		}
	})
	return s
}

func (s *spy) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *spy) firstBytes() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.got...)
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestUnreachable: nothing listening fails fast as ErrUnreachable, which
// is retryable (not ErrConfig); a server that accepts but never answers
// fails at the dial timeout.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		ep := "http://" + closedPort(t)
		start := time.Now()
		_, err := connect(t, etcdclient.Config{Endpoints: []string{ep}})
		if d := time.Since(start); d > dialTimeout/2 {
			t.Errorf("Connect took %s; want the probe to cut the wait short", d)
		}
		wantErr(t, err, []error{etcdclient.ErrUnreachable}, "connect to "+ep, "connection refused", "--endpoints")
		if errors.Is(err, etcdclient.ErrConfig) {
			t.Errorf("error %q is ErrConfig; want it retryable", err)
		}
	})
	t.Run("silent server", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0") // accepted by the kernel, never answered
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ep := "http://" + l.Addr().String()
		_, err = connect(t, etcdclient.Config{Endpoints: []string{ep}, DialTimeout: 300 * time.Millisecond})
		wantErr(t, err, []error{etcdclient.ErrUnreachable, context.DeadlineExceeded}, "no answer from etcd at "+ep+" within 300ms")
	})
}
