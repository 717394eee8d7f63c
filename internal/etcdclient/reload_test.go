package etcdclient

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
)

// A client certificate rotated on disk is presented from the next
// handshake on, without a restart; a pair half written at that moment
// leaves the last good one in use.
func TestClientCertificateIsReadAgainAtEachHandshake(t *testing.T) {
	a, b := etcdtest.NewPKI(t), etcdtest.NewPKI(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	install := func(c, k []byte) {
		t.Helper()
		if err := os.WriteFile(cert, c, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(key, k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) []byte {
		t.Helper()
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	der := func(p string) []byte {
		block, _ := pem.Decode(read(p))
		return block.Bytes
	}
	install(read(a.ClientCert), read(a.ClientKey))
	conf, err := Config{Cert: cert, Key: key}.tlsConfig(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	presented := func() []byte {
		t.Helper()
		c, err := conf.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil || len(c.Certificate) == 0 {
			t.Fatalf("GetClientCertificate: %v, %v", c, err)
		}
		return c.Certificate[0]
	}
	if !bytes.Equal(presented(), der(a.ClientCert)) {
		t.Fatal("the first handshake does not present the configured certificate")
	}
	install(read(b.ClientCert), read(b.ClientKey))
	if !bytes.Equal(presented(), der(b.ClientCert)) {
		t.Fatal("a certificate rotated on disk is not presented at the next handshake")
	}
	install(read(a.ClientCert)[:40], read(a.ClientKey)) // a rotation caught half written
	if !bytes.Equal(presented(), der(b.ClientCert)) {
		t.Fatal("a half-written pair replaced the last good one")
	}
}
