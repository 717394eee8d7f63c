package etcdclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EndpointError says why one endpoint cannot be used, and what to do.
// errors.Is matches it with ErrTLS or ErrUnreachable; errors.As reaches the
// precise cause, e.g. x509.UnknownAuthorityError or the tls.AlertError
// etcd sent.
type EndpointError struct {
	Endpoint string // as given in --endpoints
	Op       string // what failed, e.g. "TLS handshake with"
	Err      error  // the precise cause
	Hint     string // what to check or change
	kind     error
}

func (e *EndpointError) Error() string {
	msg := fmt.Sprintf("%s %s failed: %v", e.Op, e.Endpoint, e.Err)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

func (e *EndpointError) Unwrap() []error { return []error{e.kind, e.Err} }

// probeKey is read by Check, as etcdctl's endpoint health does; a
// permission error on it still proves the credentials work.
const probeKey = "health"

// Check makes one request through cli, which New built from c, and returns
// nil if etcd answered it. Otherwise the error names the precise reason
// (see EndpointError and ErrAuth) rather than a bare "context deadline
// exceeded". It returns within c.DialTimeout (or ctx's deadline if that is
// sooner) and at once when every endpoint fails at the TCP or TLS level.
// errors.Is(err, ErrConfig) holds for failures that retrying cannot fix.
func Check(ctx context.Context, cli *clientv3.Client, c Config) error {
	if _, err := c.endpoints(); err != nil {
		return err
	}
	return c.diagnose(ctx, func(ctx context.Context) error {
		_, err := cli.Get(ctx, probeKey)
		if errors.Is(err, rpctypes.ErrPermissionDenied) {
			return nil // authenticated; the user may just not read this key
		}
		return err
	})
}

// Explain turns an error of a request made with a client of c into one
// that says what to fix: refused credentials become ErrAuth, and a timeout
// or unavailable connection is diagnosed by probing the endpoints (bounded
// by c.DialTimeout; pass a live ctx, not the request's expired one). Other
// errors are returned as they are.
func Explain(ctx context.Context, c Config, err error) error {
	switch {
	case err == nil, errors.Is(err, ErrConfig), errors.Is(err, ErrUnreachable), ctx.Err() != nil:
		return err
	case !isTransportErr(err):
		return c.explainServer(err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.dialTimeout())
	defer cancel()
	return c.explainTransport(err, c.probeAll(ctx), "")
}

// diagnose runs op, a request that needs a working connection, bounded by
// the dial timeout, and probes every endpoint alongside it. If every probe
// fails, op is cancelled and the probes' errors returned; if op fails for
// lack of a connection, the probes say why.
func (c Config) diagnose(ctx context.Context, op func(context.Context) error) error {
	timeout := c.dialTimeout()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	opc := make(chan error, 1)
	probec := make(chan []*EndpointError, 1)
	go func() { opc <- op(ctx) }()
	go func() { probec <- c.probeAll(ctx) }()
	var found []*EndpointError
	for {
		select {
		case err := <-opc:
			if err == nil || !isTransportErr(err) {
				cancel()
				if probec != nil {
					<-probec
				}
				return c.explainServer(err)
			}
			if probec != nil {
				found = <-probec
			}
			if errors.Is(parent.Err(), context.Canceled) {
				return fmt.Errorf("etcd request to %s: %w", c.endpointList(), parent.Err()) // the caller gave up
			}
			return c.explainTransport(err, found, " within "+timeout.String())
		case found = <-probec:
			probec = nil
			if allFailed(found) {
				cancel()
				if err := <-opc; err == nil {
					return nil // it worked after all
				}
				return joinErrors(faults(found))
			}
		}
	}
}

func allFailed(found []*EndpointError) bool {
	for _, e := range found {
		if e == nil {
			return false
		}
	}
	return len(found) > 0
}

// faults returns the probes' findings as errors.
func faults(found []*EndpointError) []error {
	var errs []error
	for _, e := range found {
		if e != nil {
			errs = append(errs, e)
		}
	}
	return errs
}

func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// isTransportErr says whether err means no answer from etcd, as opposed to
// an answer that is an error.
func isTransportErr(err error) bool {
	var server rpctypes.EtcdError
	if errors.As(err, &server) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// explained is an error in the user's words that still matches, with
// errors.Is and errors.As, the kinds and the etcd error it explains; the
// etcd (gRPC) text itself is not shown.
type explained struct {
	msg  string
	errs []error
}

func (e *explained) Error() string   { return e.msg }
func (e *explained) Unwrap() []error { return e.errs }

// etcdRefusals maps etcd's common errors to what they mean and what to do.
var etcdRefusals = []struct {
	errs []error
	what string
}{
	{[]error{rpctypes.ErrNoLeader, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrLeaderChanged},
		"has no leader: a majority of its members must run and reach each other; check them with `etcdctl endpoint status`"},
	{[]error{rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTimeoutWaitAppliedIndex},
		"timed out handling the request (overloaded, a slow disk, or members that cannot reach each other): retry, and check etcd's health"},
	{[]error{rpctypes.ErrNoSpace},
		"is out of space (NOSPACE alarm): compact and defragment etcd, then `etcdctl alarm disarm`"},
	{[]error{rpctypes.ErrTooManyRequests},
		"is too busy (too many requests): retry later"},
	{[]error{rpctypes.ErrRequestTooLarge},
		"refused the request as too large"},
	{[]error{rpctypes.ErrNotCapable, rpctypes.ErrStopped, rpctypes.ErrCorrupt},
		"cannot serve requests (stopping, corrupt or of an older version): check etcd's logs"},
}

// explainServer turns etcd's refusals into one line that says what to do:
// refused credentials become ErrAuth; other etcd errors are named without
// their gRPC text. Errors etcd did not send are returned as they are.
func (c Config) explainServer(err error) error {
	who := fmt.Sprintf("user %q", c.Username)
	if c.Username == "" {
		who = "the client"
	}
	at := "etcd at " + c.endpointList()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return &explained{fmt.Sprintf("%v: %s refused %s (wrong user name or password): check --user and --password", ErrAuth, at, who), []error{ErrAuth, err}}
	case errors.Is(err, rpctypes.ErrUserEmpty):
		return &explained{fmt.Sprintf("%v: %s requires authentication: set --user name:password", ErrAuth, at), []error{ErrAuth, err}}
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return &explained{fmt.Sprintf("%v: %s denied %s access: grant its role readwrite on overlay's key prefix", ErrAuth, at, who), []error{ErrAuth, err}}
	}
	for _, r := range etcdRefusals {
		for _, e := range r.errs {
			if errors.Is(err, e) {
				return &explained{at + " " + r.what, []error{err}}
			}
		}
	}
	var grpcErr interface{ GRPCStatus() *status.Status }
	if errors.As(err, &grpcErr) && grpcErr.GRPCStatus().Code() != codes.OK {
		if answer, ok := notGRPC(grpcErr.GRPCStatus().Message()); ok {
			return &explained{fmt.Sprintf("the server at %s answered %s, not etcd's gRPC: %s", c.endpointList(), answer, notEtcdHint), []error{ErrUnreachable, err}}
		}
		// An etcd answer not mapped above: its message, without gRPC's
		// "rpc error: code = ... desc =" wrapping.
		return &explained{fmt.Sprintf("%s refused the request: %s: check etcd's logs", at, grpcErr.GRPCStatus().Message()), []error{err}}
	}
	var server rpctypes.EtcdError
	if errors.As(err, &server) {
		return &explained{fmt.Sprintf("%s refused the request: %s: check etcd's logs", at, strings.TrimPrefix(server.Error(), "etcdserver: ")), []error{err}}
	}
	return err
}

// notEtcdHint is what to do when an endpoint is not etcd's client port.
const notEtcdHint = "check that --endpoints names etcd's client port (2379 by default)"

// notGRPC recognises gRPC's words for an answer that was HTTP but not
// gRPC (a web server, a proxy, etcd's peer or metrics port), or gRPC
// without etcd's services, and says what the server answered, e.g.
// "HTTP 404 (Not Found)".
func notGRPC(msg string) (string, bool) {
	const status = "unexpected HTTP status code received from server: "
	if _, rest, ok := strings.Cut(msg, status); ok {
		code, _, _ := strings.Cut(rest, ";")
		return "HTTP " + strings.TrimSpace(code), true
	}
	if _, rest, ok := strings.Cut(msg, "unknown service "); ok && strings.HasPrefix(rest, "etcdserverpb.") {
		return "gRPC without etcd's services (" + strings.TrimSpace(rest) + " is unknown there)", true
	}
	const ctype = "received unexpected content-type "
	if _, rest, ok := strings.Cut(msg, ctype); ok {
		typ, _, _ := strings.Cut(rest, "\n")
		return "with content type " + strings.TrimSpace(typ), true
	}
	return "", false
}

// explainTransport explains a request that got no answer, by the probes'
// findings when there are any.
func (c Config) explainTransport(err error, found []*EndpointError, within string) error {
	generic := error(&explained{fmt.Sprintf("%v: no answer from etcd at %s%s: check --endpoints and that etcd is running and reachable",
		ErrUnreachable, c.endpointList(), within), []error{ErrUnreachable, err}})
	errs := faults(found)
	if len(errs) == 0 {
		return generic
	}
	if !allFailed(found) {
		// The other endpoints did not answer in time. If at most half of
		// them can be reached at all, the likely cause is a cluster that
		// lost its quorum: the members left cannot serve a request.
		if len(found) > 1 && 2*len(errs) >= len(found) {
			generic = &explained{fmt.Sprintf("%v: %d of %d endpoints unreachable and no answer from the others%s: if they are the members of one cluster, it has lost its quorum (a majority of members must run)",
				ErrUnreachable, len(errs), len(found), within), []error{ErrUnreachable, err}}
		}
		errs = append(errs, generic)
	}
	return joinErrors(errs)
}

// probeAll probes every endpoint in parallel; an entry is nil where the
// probe found no fault or could not tell in time.
func (c Config) probeAll(ctx context.Context) []*EndpointError {
	eps, err := c.endpoints()
	if err != nil {
		return nil
	}
	var conf *tls.Config
	if c.wantTLS(eps) {
		if conf, err = c.tlsConfig(time.Now()); err != nil {
			return nil
		}
	}
	found := make([]*EndpointError, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { found[i] = c.probe(ctx, ep, conf) })
	}
	wg.Wait()
	return found
}

// probe opens a connection to ep as the etcd client would (TCP or unix
// socket, TLS with conf when the client would use it) and exchanges the
// first HTTP/2 frames, which is where a server rejects a missing client
// certificate under TLS 1.3. It never sends credentials.
func (c Config) probe(ctx context.Context, ep endpoint, conf *tls.Config) *EndpointError {
	conn, err := dial(ctx, ep)
	if err != nil {
		if ctx.Err() != nil {
			return nil // out of time: the request's own error says so
		}
		return &EndpointError{Endpoint: ep.raw, Op: "connect to", Err: err, kind: ErrUnreachable,
			Hint: "check --endpoints and that etcd is running and reachable"}
	}
	defer conn.Close()
	if !ep.usesTLS(conf != nil) {
		err := h2Hello(conn)
		if errors.Is(err, errHTTP1) {
			return &EndpointError{Endpoint: ep.raw, Op: "connect to", kind: ErrUnreachable, Err: err, Hint: notEtcdHint}
		}
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if speaksTLS(ctx, ep) {
			return &EndpointError{Endpoint: ep.raw, Op: "plaintext connection to", kind: ErrTLS,
				Err:  errors.New("etcd answers with TLS only"),
				Hint: "use https:// and --cacert with the CA of etcd's certificate"}
		}
		return nil
	}
	tconf := conf.Clone()
	if tconf.ServerName == "" {
		tconf.ServerName = ep.serverName
	}
	tconf.NextProtos = []string{"h2"}
	tc := tls.Client(conn, tconf)
	if err := tc.HandshakeContext(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return c.tlsFailure(ep, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		return &EndpointError{Endpoint: ep.raw, Op: "TLS handshake with", kind: ErrTLS,
			Err:  fmt.Errorf("no HTTP/2 negotiated (ALPN %q)", p),
			Hint: "etcd speaks gRPC over HTTP/2: a TLS proxy in front of it must pass ALPN h2 through"}
	}
	if err := h2Hello(tc); err != nil {
		if errors.Is(err, errHTTP1) {
			return &EndpointError{Endpoint: ep.raw, Op: "TLS connection to", kind: ErrUnreachable, Err: err, Hint: notEtcdHint}
		}
		if ctx.Err() != nil {
			return nil
		}
		return c.tlsFailure(ep, err)
	}
	return nil
}

// dial connects to ep, with the connection's I/O bounded by ctx.
func dial(ctx context.Context, ep endpoint) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, ep.network, ep.addr)
	if err != nil {
		return nil, err
	}
	// Reads and writes give up when ctx ends, by deadline or cancel.
	context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	return conn, nil
}

// h2Preface is an HTTP/2 client connection preface with an empty SETTINGS
// frame; an HTTP/2 server such as etcd answers with its own SETTINGS.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// errHTTP1 is an answer to the HTTP/2 preface in HTTP/1.x: a web server
// or a proxy, not etcd.
var errHTTP1 = errors.New("it answers HTTP/1.x, not etcd's gRPC (HTTP/2)")

// h2Hello sends the preface and waits for the first bytes of the answer:
// an HTTP/2 server's SETTINGS frame, or errHTTP1 for an HTTP/1.x status
// line.
func h2Hello(conn net.Conn) error {
	if _, err := conn.Write(h2Preface); err != nil {
		return err
	}
	var b [5]byte
	n, err := io.ReadFull(conn, b[:])
	if string(b[:n]) == "HTTP/" {
		return errHTTP1
	}
	if n > 0 {
		return nil
	}
	return err
}

// speaksTLS says whether ep completes, or fails only at verifying, a TLS
// handshake: then it is a TLS server. Nothing is sent after the handshake.
func speaksTLS(ctx context.Context, ep endpoint) bool {
	conn, err := dial(ctx, ep)
	if err != nil {
		return false
	}
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{ServerName: ep.serverName, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
	err = tc.HandshakeContext(ctx)
	var verify *tls.CertificateVerificationError
	_, alert := remoteAlert(err)
	return err == nil || errors.As(err, &verify) || alert
}

// remoteAlert returns the TLS alert the server sent, if err is one.
// crypto/tls reports it as a net.OpError "remote error" around an
// unexported type whose text tls.AlertError shares.
func remoteAlert(err error) (tls.AlertError, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return 0, false
	}
	msg := op.Err.Error()
	for code := range 256 {
		if tls.AlertError(code).Error() == msg {
			return tls.AlertError(code), true
		}
	}
	return 0, false
}

// TLS alerts (RFC 8446 section 6) that point at a setting.
const (
	alertHandshakeFailure     tls.AlertError = 40
	alertBadCertificate       tls.AlertError = 42
	alertUnsupportedCert      tls.AlertError = 43
	alertCertificateRevoked   tls.AlertError = 44
	alertCertificateExpired   tls.AlertError = 45
	alertCertificateUnknown   tls.AlertError = 46
	alertUnknownCA            tls.AlertError = 48
	alertProtocolVersion      tls.AlertError = 70
	alertInsufficientSecurity tls.AlertError = 71
	alertCertificateRequired  tls.AlertError = 116
	alertNoApplicationProto   tls.AlertError = 120
)

// tlsFailure explains a failed TLS handshake with ep.
func (c Config) tlsFailure(ep endpoint, err error) *EndpointError {
	e := &EndpointError{Endpoint: ep.raw, Op: "TLS handshake with", Err: err, kind: ErrTLS}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
	)
	switch alert, isAlert := remoteAlert(err); {
	case errors.As(err, &unknown):
		if c.CACert != "" {
			e.Hint = fmt.Sprintf("etcd's certificate is not signed by the CA in --cacert %s: pass the CA that issued it", c.CACert)
		} else {
			e.Hint = "etcd's certificate is not signed by a CA this host trusts: pass its CA with --cacert"
		}
	case errors.As(err, &hostname):
		e.Hint = fmt.Sprintf("etcd's certificate is not valid for %s: use a name or address it lists in --endpoints, or reissue it", ep.serverName)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		e.Hint = "etcd's certificate has expired or is not yet valid: renew it, or check this host's clock"
	case errors.As(err, &verify):
		e.Hint = "etcd's certificate does not verify against --cacert: check --cacert"
	case isAlert:
		e.Err = fmt.Errorf("etcd refused the TLS session: %w", alert)
		e.Hint = c.alertHint(alert)
	case errors.As(err, &record):
		e.Err = fmt.Errorf("etcd does not speak TLS: %w", err)
		e.Hint = "use http:// without --cacert/--cert/--key, or serve TLS on etcd (--cert-file/--key-file)"
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		// A plaintext etcd hangs up on a TLS hello, but so might a server
		// that is restarting: say what to check, and keep it retryable.
		// (Finding out by talking plaintext would defeat the point of TLS.)
		e.kind = ErrUnreachable
		e.Err = fmt.Errorf("etcd closed the connection: %w", err)
		e.Hint = "if etcd serves plaintext, use http:// without --cacert/--cert/--key, or serve TLS on etcd (--cert-file/--key-file); check that the endpoint is etcd's client port"
	default:
		e.Hint = "check --cacert, --cert and --key"
	}
	return e
}

func (c Config) alertHint(alert tls.AlertError) string {
	switch alert {
	case alertCertificateRequired, alertBadCertificate, alertUnsupportedCert, alertCertificateUnknown, alertUnknownCA, alertCertificateRevoked, alertCertificateExpired:
		if c.Cert == "" {
			return "etcd requires a client certificate: pass --cert and --key"
		}
		if alert == alertCertificateExpired {
			return fmt.Sprintf("etcd finds the client certificate --cert %s expired: renew it", c.Cert)
		}
		return fmt.Sprintf("etcd rejected the client certificate --cert %s: it must be issued by a CA in etcd's --trusted-ca-file and allow client authentication", c.Cert)
	case alertHandshakeFailure, alertProtocolVersion, alertInsufficientSecurity:
		return "no TLS version or cipher suite in common with etcd (TLS 1.2 or later is required)"
	case alertNoApplicationProto:
		return "etcd's TLS endpoint does not offer HTTP/2 (ALPN h2), which gRPC needs"
	}
	return "check --cacert, --cert and --key"
}
