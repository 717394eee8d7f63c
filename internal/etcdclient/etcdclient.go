// Package etcdclient builds an etcd v3 client from the flags overlayd and its
// CLI share (endpoints, TLS files, user), with errors that say which setting
// is wrong. TLS is used exactly when asked for: an https endpoint or a CA,
// certificate or key file; it never falls back to plaintext.
//
// The etcd client hides why a connection fails: gRPC retries the TLS
// handshake in the background and a request only ends with "context deadline
// exceeded". Connect and Check therefore probe each endpoint themselves,
// alongside the first request, with the same TLS settings (TCP connect, TLS
// handshake, the first bytes of HTTP/2), and report the precise cause, e.g.
// the server certificate's unknown authority or the server's "certificate
// required" alert, together with the flag to fix.
//
// Passwords never appear in errors, and Config redacts its password when
// printed or logged.
package etcdclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// DefaultDialTimeout bounds connecting and the startup check when
// Config.DialTimeout is not set.
const DefaultDialTimeout = 5 * time.Second

// gRPC keepalive on every connection to an etcd member, while calls (a
// watch, a lease keepalive) are open on it. A member that vanishes without
// closing its connections (host gone, blackholing firewall) leaves a
// connection that TCP does not report dead for minutes — forever if a
// middlebox still acknowledges — and the watch and lease renewals on it
// hang. With keepalive, the connection is dropped after
// DefaultKeepAliveTime of silence plus DefaultKeepAliveTimeout, and the
// client carries on with the other members. 10 s is the least gRPC allows
// (it raises shorter values), and etcd accepts pings every 5 s
// (--grpc-keepalive-min-time).
const (
	DefaultKeepAliveTime    = 10 * time.Second
	DefaultKeepAliveTimeout = 5 * time.Second
)

// Config is what a user can set to reach etcd.
type Config struct {
	Endpoints   []string
	CACert      string // PEM file with the CA that signed the server certificate
	Cert, Key   string // PEM files of the client certificate, for mutual TLS
	Username    string
	Password    string
	DialTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout tune gRPC keepalive (defaults
	// DefaultKeepAliveTime and DefaultKeepAliveTimeout); negative turns
	// it off.
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration
	// DialOptions are added to the client's own (tools/scale counts
	// every message with them); not settable by users.
	DialOptions []grpc.DialOption
}

// kindError is a class of failure that is also a more general one, so
// errors.Is(err, ErrTLS) and errors.Is(err, ErrConfig) both hold for a TLS
// failure.
type kindError struct {
	msg    string
	parent error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.parent }

var (
	// ErrConfig marks a client setting that cannot work; retrying does not
	// help. ErrTLS and ErrAuth are kinds of it.
	ErrConfig = errors.New("invalid etcd client settings")
	// ErrTLS marks a TLS failure with an endpoint: an untrusted or
	// mismatched server certificate, a missing or rejected client
	// certificate, or TLS on one side only.
	ErrTLS error = &kindError{"etcd TLS failed", ErrConfig}
	// ErrAuth marks credentials etcd refuses: none while etcd requires
	// them, a wrong user name or password, or missing permissions.
	ErrAuth error = &kindError{"etcd authentication failed", ErrConfig}
	// ErrUnreachable marks an etcd that did not answer: nothing listens,
	// the network drops the packets, or it did not respond in time. It may
	// be transient.
	ErrUnreachable = errors.New("etcd unreachable")
)

// ParseUser splits etcdctl's --user "name[:password]".
func ParseUser(user string) (name, password string) {
	name, password, _ = strings.Cut(user, ":")
	return name, password
}

// New returns a client. Without a user name the connection is made lazily
// by the first request; with one, New authenticates at once (bounded by the
// dial timeout) and a failure is explained like Check's.
func New(c Config) (*clientv3.Client, error) {
	cc, err := c.clientConfig()
	if err != nil {
		return nil, err
	}
	if cc.Username == "" {
		cli, err := clientv3.New(cc)
		if err != nil {
			return nil, fmt.Errorf("etcd client for %s: %w", c.endpointList(), err)
		}
		return cli, nil
	}
	// clientv3.New authenticates under its own DialTimeout. Its context is
	// cancelled early only if the probe proves the endpoints unusable;
	// otherwise it lives as long as the client.
	life, stop := context.WithCancel(context.Background())
	cc.Context = life
	var cli *clientv3.Client
	err = c.diagnose(context.Background(), func(ctx context.Context) error {
		abort := context.AfterFunc(ctx, stop)
		var err error
		cli, err = clientv3.New(cc)
		if !abort() && err == nil {
			// The probe failed the endpoints just as New succeeded.
			_ = cli.Close()
			return context.Cause(ctx)
		}
		return err
	})
	if err != nil {
		stop()
		return nil, err
	}
	context.AfterFunc(cli.Ctx(), stop)
	return cli, nil
}

// Connect returns a client that has been checked to work (see Check). The
// daemon and the CLI use it to fail fast, with the precise reason, on a
// wrong CA, a missing client certificate or a wrong password.
func Connect(ctx context.Context, c Config) (*clientv3.Client, error) {
	cli, err := New(c)
	if err != nil {
		return nil, err
	}
	if err := Check(ctx, cli, c); err != nil {
		_ = cli.Close()
		return nil, err
	}
	return cli, nil
}

func (c Config) dialTimeout() time.Duration {
	if c.DialTimeout > 0 {
		return c.DialTimeout
	}
	return DefaultDialTimeout
}

// orDefault is d for zero, zero (off) for negative, else v.
func orDefault(v, d time.Duration) time.Duration {
	switch {
	case v == 0:
		return d
	case v < 0:
		return 0
	}
	return v
}

func (c Config) endpointList() string { return strings.Join(c.Endpoints, ",") }

// wantTLS says whether the settings ask for TLS.
func (c Config) wantTLS(eps []endpoint) bool {
	if c.CACert != "" || c.Cert != "" || c.Key != "" {
		return true
	}
	for _, ep := range eps {
		if ep.scheme == "https" || ep.scheme == "unixs" {
			return true
		}
	}
	return false
}

// Validate checks the settings without connecting: the endpoints, the
// certificate and key pair, the user and password pair, TLS with http://
// endpoints, and that the TLS files hold what they should, with a client
// certificate valid now (not expired, not yet to come). Errors wrap
// ErrConfig and name the flag, so a CLI can report them before doing
// anything, as the bad flag values they are. A certificate renewed in
// place later is read again at each new connection (see reloading).
func (c Config) Validate() error {
	_, err := c.clientConfigAt(time.Now())
	return err
}

// CheckEndpoint says why raw cannot be an etcd endpoint (one element of
// --endpoints), or returns nil.
func CheckEndpoint(raw string) error {
	_, err := parseEndpoint(raw)
	return err
}

func (c Config) clientConfig() (clientv3.Config, error) { return c.clientConfigAt(time.Now()) }

// clientConfigAt builds the client's settings, checking certificates'
// validity at now (not at all for the zero time).
func (c Config) clientConfigAt(now time.Time) (clientv3.Config, error) {
	eps, err := c.endpoints()
	if err != nil {
		return clientv3.Config{}, err
	}
	switch {
	case c.Cert != "" && c.Key == "":
		return clientv3.Config{}, fmt.Errorf("%w: --cert %s needs its private key: set --key", ErrConfig, c.Cert)
	case c.Key != "" && c.Cert == "":
		return clientv3.Config{}, fmt.Errorf("%w: --key %s needs its certificate: set --cert", ErrConfig, c.Key)
	case c.Password != "" && c.Username == "":
		return clientv3.Config{}, fmt.Errorf("%w: --password needs a user name: set --user NAME (or --user NAME:PASSWORD without --password)", ErrConfig)
	case c.Username != "" && c.Password == "":
		// The etcd client would silently skip authentication.
		return clientv3.Config{}, fmt.Errorf("%w: user %q has no password: use --user %s:PASSWORD or --password", ErrConfig, c.Username, c.Username)
	}
	cc := clientv3.Config{
		Endpoints:            c.Endpoints,
		DialTimeout:          c.dialTimeout(),
		DialKeepAliveTime:    orDefault(c.KeepAliveTime, DefaultKeepAliveTime),
		DialKeepAliveTimeout: orDefault(c.KeepAliveTimeout, DefaultKeepAliveTimeout),
		Username:             c.Username,
		Password:             c.Password,
		Logger:               zap.NewNop(),
		// gRPC's default reconnect backoff grows to 2 minutes: after an etcd
		// outage a daemon would wait that long to notice etcd is back. Cap it
		// at a few seconds; a node agent reconnecting is cheap.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	cc.DialOptions = append(cc.DialOptions, c.DialOptions...)
	if !c.wantTLS(eps) {
		return cc, nil
	}
	// The etcd client sends plaintext to every http:// endpoint even when
	// TLS is configured (and, with several endpoints, uses the first
	// endpoint's choice for all of them).
	for _, ep := range eps {
		if ep.scheme == "http" {
			return clientv3.Config{}, fmt.Errorf("%w: endpoint %s is plaintext http but TLS is configured: use https://", ErrConfig, ep.raw)
		}
	}
	tlsConf, err := c.tlsConfig(now)
	if err != nil {
		return clientv3.Config{}, err
	}
	cc.TLS = tlsConf
	return cc, nil
}

// endpoint is one --endpoints entry, read the way the etcd client reads it.
type endpoint struct {
	raw        string
	scheme     string // "http", "https", "unix", "unixs" or "" for host:port
	network    string // "tcp" or "unix"
	addr       string
	serverName string // the name the server certificate must hold
}

func (c Config) endpoints() ([]endpoint, error) {
	if len(c.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints: set --endpoints (e.g. http://127.0.0.1:2379)", ErrConfig)
	}
	eps := make([]endpoint, 0, len(c.Endpoints))
	for _, raw := range c.Endpoints {
		ep, err := parseEndpoint(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: endpoint %q: %s", ErrConfig, raw, err)
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

// parseEndpoint follows the etcd client's endpoint rules (unix[s]:path,
// http[s]://host:port, bare host:port), stricter where the client would
// fail later or silently: schemes other than these and missing ports are
// refused.
func parseEndpoint(raw string) (endpoint, error) {
	ep := endpoint{raw: raw}
	if raw == "" {
		return ep, errors.New("empty (check --endpoints for a stray comma)")
	}
	for _, s := range []string{"unixs", "unix"} {
		rest, ok := strings.CutPrefix(raw, s+":")
		if !ok {
			continue
		}
		rest = strings.TrimPrefix(rest, "//")
		if rest == "" {
			return ep, errors.New("no socket path")
		}
		ep.scheme, ep.network, ep.addr, ep.serverName = s, "unix", rest, path.Base(rest)
		return ep, nil
	}
	hostport := raw
	if strings.Contains(raw, "://") {
		u, err := url.Parse(raw)
		if err != nil {
			return ep, err
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return ep, fmt.Errorf("scheme %q: use http://, https://, unix:// or unixs://", u.Scheme)
		}
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
			return ep, errors.New("want scheme://host:port only")
		}
		ep.scheme, hostport = u.Scheme, u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" || port == "" {
		return ep, errors.New("want host:port, e.g. https://10.0.0.1:2379")
	}
	ep.network, ep.addr, ep.serverName = "tcp", hostport, host
	return ep, nil
}

// usesTLS says whether the etcd client speaks TLS to ep.
func (ep endpoint) usesTLS(tlsConfigured bool) bool {
	switch ep.scheme {
	case "https", "unixs":
		return true
	case "http":
		return false
	}
	return tlsConfigured
}

func (c Config) tlsConfig(now time.Time) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		data, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("%w: read CA file --cacert %s: %w", ErrConfig, c.CACert, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("%w: CA file --cacert %s holds no PEM certificate", ErrConfig, c.CACert)
		}
		conf.RootCAs = pool
	}
	if c.Cert != "" {
		pair, err := loadKeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, err
		}
		if leaf := pair.Leaf; leaf != nil && !now.IsZero() {
			if now.After(leaf.NotAfter) {
				return nil, fmt.Errorf("%w: client certificate --cert %s expired at %s: renew it", ErrConfig, c.Cert, leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			if now.Before(leaf.NotBefore) {
				return nil, fmt.Errorf("%w: client certificate --cert %s is not valid before %s: check this host's clock", ErrConfig, c.Cert, leaf.NotBefore.UTC().Format(time.RFC3339))
			}
		}
		conf.GetClientCertificate = reloading(c.Cert, c.Key, pair)
	}
	return conf, nil
}

// reloading returns a GetClientCertificate that reads the key pair from
// its files at each handshake (a new connection: rare), so a certificate
// rotated on disk (cert-manager, a renewal cron) is presented from the
// next connection on without a restart. A pair that cannot be read at
// that moment — a rotation half written — leaves the last good one in use.
func reloading(certFile, keyFile string, pair tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	var mu sync.Mutex
	last := &pair
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if p, err := loadKeyPair(certFile, keyFile); err == nil {
			last = &p
		}
		return last, nil
	}
}

// loadKeyPair is tls.LoadX509KeyPair with errors that name the bad file.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: read client certificate --cert %s: %w", ErrConfig, certFile, err)
	}
	if !hasPEM(certPEM, func(typ string) bool { return typ == "CERTIFICATE" }) {
		return tls.Certificate{}, fmt.Errorf("%w: client certificate --cert %s holds no PEM certificate", ErrConfig, certFile)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: read client key --key %s: %w", ErrConfig, keyFile, err)
	}
	if !hasPEM(keyPEM, func(typ string) bool { return typ == "PRIVATE KEY" || strings.HasSuffix(typ, " PRIVATE KEY") }) {
		return tls.Certificate{}, fmt.Errorf("%w: client key --key %s holds no PEM private key", ErrConfig, keyFile)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The parser's own message never quotes key material.
		return tls.Certificate{}, fmt.Errorf("%w: client certificate --cert %s with key --key %s: %w", ErrConfig, certFile, keyFile, err)
	}
	return pair, nil
}

func hasPEM(data []byte, typeOK func(string) bool) bool {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return false
		}
		if typeOK(b.Type) {
			return true
		}
	}
}

// String describes c with the password redacted.
func (c Config) String() string {
	pw := ""
	if c.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{Endpoints:%v CACert:%s Cert:%s Key:%s Username:%s Password:%s DialTimeout:%s}",
		c.Endpoints, c.CACert, c.Cert, c.Key, c.Username, pw, c.DialTimeout)
}

// GoString is String, so %#v does not print the password either.
func (c Config) GoString() string { return "etcdclient.Config" + c.String() }

// LogValue lets slog print c without its password.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("endpoints", c.Endpoints),
		slog.String("cacert", c.CACert),
		slog.String("cert", c.Cert),
		slog.String("key", c.Key),
		slog.String("user", c.Username),
		slog.Bool("password_set", c.Password != ""),
		slog.Duration("dial_timeout", c.DialTimeout),
	)
}
