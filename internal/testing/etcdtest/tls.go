package etcdtest

// TLS and authentication for the embedded server, so client code is tested
// against the same handshakes and permission checks a production etcd
// applies: server TLS (the client verifies the server against a CA file),
// mutual TLS (the server also demands a client certificate) and etcd's own
// user/password authentication. The certificates come from a throwaway CA
// generated per test, valid for an hour, written to the test's temp dir.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
)

// PKI is a throwaway certificate authority with one server and one client
// certificate, each as PEM files.
type PKI struct {
	// CACert is the CA certificate a client passes as --cacert.
	CACert string
	// ServerCert and ServerKey are valid for 127.0.0.1, ::1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate (CN ClientName)
	// for mutual TLS.
	ClientCert, ClientKey string
	// ClientName is the client certificate's common name; etcd with
	// authentication enabled treats it as the user name.
	ClientName string

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewPKI generates a CA, a server and a client certificate into a new
// temporary directory of t. Two calls give two unrelated CAs, which is how a
// test gets a "wrong" CA.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p, err := newPKI(t.TempDir(), "overlay-test-client")
	if err != nil {
		t.Fatalf("generate test PKI: %v", err)
	}
	return p
}

func newPKI(dir, clientName string) (*PKI, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "overlay test CA " + filepath.Base(dir)},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &PKI{
		CACert:     filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
		ClientName: clientName,
		ca:         ca,
		caKey:      caKey,
	}
	if err := writePEM(p.CACert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	// The server certificate is also valid for client auth: etcd's gRPC
	// gateway dials the server with it when client certificates are required.
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := p.issue(server, p.ServerCert, p.ServerKey); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: clientName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := p.issue(client, p.ClientCert, p.ClientKey); err != nil {
		return nil, err
	}
	return p, nil
}

// issue signs tmpl with the CA and writes certificate and key files.
func (p *PKI) issue(tmpl *x509.Certificate, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = p.ca.NotBefore
	tmpl.NotAfter = p.ca.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "PRIVATE KEY", keyDER)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// ServerTLS serves clients over https with the PKI's server certificate.
// Clients need not present a certificate.
func (p *PKI) ServerTLS() Option {
	return func(cfg *embed.Config) {
		secure := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
		cfg.ListenClientUrls = []url.URL{secure}
		cfg.AdvertiseClientUrls = []url.URL{secure}
		cfg.ClientTLSInfo.CertFile = p.ServerCert
		cfg.ClientTLSInfo.KeyFile = p.ServerKey
	}
}

// MutualTLS is ServerTLS plus a client certificate signed by the PKI's CA
// required on every connection.
func (p *PKI) MutualTLS() Option {
	return func(cfg *embed.Config) {
		p.ServerTLS()(cfg)
		cfg.ClientTLSInfo.TrustedCAFile = p.CACert
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
}

// FastPasswords makes etcd hash user passwords with bcrypt's minimum cost,
// so tests that authenticate many times stay fast.
func FastPasswords() Option {
	return func(cfg *embed.Config) { cfg.BcryptCost = uint(bcrypt.MinCost) }
}

// ClientTLSConfig trusts the PKI's CA and presents its client certificate.
func (p *PKI) ClientTLSConfig(t testing.TB) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(p.CACert)
	if err != nil {
		t.Fatalf("read test CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("test CA %s holds no certificate", p.CACert)
	}
	pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		t.Fatalf("load test client certificate: %v", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// TLSClient returns a client of a server started with ServerTLS or
// MutualTLS that trusts p's CA and presents its client certificate,
// authenticated as user if user is not empty; closed with t.
func (s *Server) TLSClient(t testing.TB, p *PKI, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint},
		TLS:         p.ClientTLSConfig(t),
		Username:    user,
		Password:    password,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", s.Endpoint, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// EnableAuth turns on etcd authentication through cli: it creates user
// root with rootPassword and the built-in root role, then enables auth.
// Afterwards cli (and every other client) needs credentials.
func EnableAuth(t testing.TB, cli *clientv3.Client, rootPassword string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user root", func() error { _, err := cli.UserAdd(ctx, "root", rootPassword); return err }},
		{"grant role root to root", func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err }},
		{"enable auth", func() error { _, err := cli.AuthEnable(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
	}
}

// AddUser creates user name with password and a role of the same name that
// may read and write the keys under prefix, through cli (which must be root
// once auth is enabled).
func AddUser(t testing.TB, cli *clientv3.Client, name, password, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user", func() error { _, err := cli.UserAdd(ctx, name, password); return err }},
		{"add role", func() error { _, err := cli.RoleAdd(ctx, name); return err }},
		{"grant readwrite on " + prefix, func() error {
			_, err := cli.RoleGrantPermission(ctx, name, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"grant role", func() error { _, err := cli.UserGrantRole(ctx, name, name); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("user %s: %s: %v", name, s.what, err)
		}
	}
}
