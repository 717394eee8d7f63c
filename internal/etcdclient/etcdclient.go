// Package etcdclient builds an etcd v3 client from the flags overlayd and its
// CLI share (endpoints, TLS files, user), with errors that say which setting
// is wrong. TLS is used exactly when asked for: an https endpoint or a CA,
// certificate or key file; it never falls back to plaintext.
package etcdclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Config is what a user can set to reach etcd.
type Config struct {
	Endpoints   []string
	CACert      string // PEM file with the CA that signed the server certificate
	Cert, Key   string // PEM files of the client certificate, for mutual TLS
	Username    string
	Password    string
	DialTimeout time.Duration
}

// ErrConfig marks a client setting that cannot work.
var ErrConfig = errors.New("invalid etcd client settings")

// ParseUser splits etcdctl's --user "name[:password]".
func ParseUser(user string) (name, password string) {
	name, password, _ = strings.Cut(user, ":")
	return name, password
}

// New returns a client. The connection is made lazily by the first request.
func New(c Config) (*clientv3.Client, error) {
	cc, err := c.clientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(c.Endpoints, ","), err)
	}
	return cli, nil
}

func (c Config) clientConfig() (clientv3.Config, error) {
	if len(c.Endpoints) == 0 {
		return clientv3.Config{}, fmt.Errorf("%w: no endpoints: set --endpoints (e.g. http://127.0.0.1:2379)", ErrConfig)
	}
	if (c.Cert == "") != (c.Key == "") {
		return clientv3.Config{}, fmt.Errorf("%w: --cert and --key must be given together", ErrConfig)
	}
	if c.Password != "" && c.Username == "" {
		return clientv3.Config{}, fmt.Errorf("%w: a password needs a user name (--user name:password)", ErrConfig)
	}
	cc := clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: c.DialTimeout,
		Username:    c.Username,
		Password:    c.Password,
		Logger:      zap.NewNop(),
	}
	if cc.DialTimeout <= 0 {
		cc.DialTimeout = 5 * time.Second
	}
	wantTLS := c.CACert != "" || c.Cert != ""
	for _, ep := range c.Endpoints {
		if strings.HasPrefix(ep, "https://") {
			wantTLS = true
		}
	}
	if !wantTLS {
		return cc, nil
	}
	for _, ep := range c.Endpoints {
		if strings.HasPrefix(ep, "http://") {
			return clientv3.Config{}, fmt.Errorf("%w: endpoint %s is plaintext http but TLS is configured: use https://", ErrConfig, ep)
		}
	}
	tlsConf, err := c.tlsConfig()
	if err != nil {
		return clientv3.Config{}, err
	}
	cc.TLS = tlsConf
	return cc, nil
}

func (c Config) tlsConfig() (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("%w: read CA file --cacert %s: %v", ErrConfig, c.CACert, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: CA file --cacert %s holds no PEM certificate", ErrConfig, c.CACert)
		}
		conf.RootCAs = pool
	}
	if c.Cert != "" {
		pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: load client certificate --cert %s / --key %s: %v", ErrConfig, c.Cert, c.Key, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}
