// Package kubepki makes the key material of a Kubernetes control plane
// for the lab (test/kube) and the scale tool (tools/scale): a CA, serving
// certificates it signs, and the service account token key pair.
package kubepki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the cluster's key material, made by the lab: one CA that signs
// the API server's and the overlay etcd's serving certificates, and the
// RSA key pair that signs and checks service account tokens. Every file
// is written under dir.
type PKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CACert string // ca.pem
	CAKey  string // ca-key.pem
	SAKey  string // sa.key (RSA, PKCS#1), the token signer
	SAPub  string // sa.pub
}

// New makes the CA and the service account key pair under dir.
func New(dir string) (*PKI, error) {
	p := &PKI{dir: dir, CACert: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem"),
		SAKey: filepath.Join(dir, "sa.key"), SAPub: filepath.Join(dir, "sa.pub")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "overlay kube lab CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	if err := writePEM(p.CACert, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(p.caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.CAKey, "EC PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	return p, writePEM(p.SAPub, "PUBLIC KEY", pub)
}

// Serving writes name.pem and name-key.pem: a serving (and client)
// certificate signed by the CA for the given DNS names and addresses.
func (p *PKI) Serving(name string, dnsNames []string, ips ...net.IP) (cert, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	cert, key = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	if err := writePEM(cert, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	return cert, key, writePEM(key, "EC PRIVATE KEY", keyDER)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
