package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Tests of issue 28 item 9: exit codes and messages as documented.

// TestStrayArgumentsSaySo: an argument a command does not take is named as
// such (cobra said "unknown command"), a missing one by its name; both
// exit 2.
func TestStrayArgumentsSaySo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lease", "list", "extra"}, `unexpected argument "extra": overlayd lease list takes no arguments (flags start with --)`},
		{[]string{"version", "x"}, `unexpected argument "x": overlayd version takes no arguments`},
		{[]string{"config", "put", "net.json"}, `unexpected argument "net.json": overlayd config put takes no arguments`},
		{[]string{"lease", "get", "10.244.7.0/24", "10.244.8.0/24"}, `unexpected argument "10.244.8.0/24": overlayd lease get takes one argument, SUBNET`},
		{[]string{"lease", "revoke"}, "missing SUBNET: usage: overlayd lease revoke SUBNET"},
		{[]string{"lease", "nope"}, `unknown command "nope" for "overlayd lease"`}, // a group: it is a command
	} {
		r := runEnv(t, nil, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.err, tc.want) {
			t.Errorf("overlayd %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), r.code, r.err, tc.want)
		}
		if tc.args[1] != "nope" && strings.Contains(r.err, "unknown command") {
			t.Errorf("overlayd %s calls an argument an unknown command: %q", strings.Join(tc.args, " "), r.err)
		}
	}
}

// TestExpiredClientCertificateIsAUsageError: a client certificate that has
// expired is a bad --cert value like a missing file: exit 2 naming it,
// before any connection (it was exit 1, found only when connecting).
func TestExpiredClientCertificateIsAUsageError(t *testing.T) {
	etcd, accepted := countingListener(t)
	cert, key := expiredCert(t)
	ep := strings.Replace(etcd, "http:", "https:", 1)
	for _, tc := range []struct {
		environ []string
		args    []string
		name    string
	}{
		{nil, []string{"--cert", cert, "--key", key}, "--cert " + cert},
		{[]string{"OVERLAY_CERT=" + cert, "OVERLAY_KEY=" + key}, nil, "OVERLAY_CERT"},
	} {
		args := append([]string{"--endpoints", ep, "--dial-timeout", "2s", "lease", "list"}, tc.args...)
		r := runEnv(t, tc.environ, args...)
		if r.code != exitUsage || !strings.Contains(r.err, "expired at") || !strings.Contains(r.err, "renew it") || !strings.Contains(r.err, tc.name) {
			t.Errorf("%q overlayd %s: exit %d, stderr %q; want exit 2 naming %s, expired", tc.environ, strings.Join(args, " "), r.code, r.err, tc.name)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("connected to etcd %d times with an expired certificate", n)
	}
}

// expiredCert writes a self-signed client certificate that expired an
// hour ago, and its key.
func expiredCert(t *testing.T) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "expired"},
		NotBefore:    time.Now().Add(-48 * time.Hour),
		NotAfter:     time.Now().Add(-time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestEndpointThatIsNotEtcd: an endpoint that answers HTTP but not etcd's
// gRPC — a web server speaking HTTP/1.1, HTTP/2 answering 404, a gRPC
// server without etcd's services — is
// named as such, with what to check, and no gRPC text reaches the user
// (it said "refused the request: unexpected HTTP status code received from
// server: 404 (Not Found); transport: … data: …", or waited the whole
// --dial-timeout for "no answer").
func TestEndpointThatIsNotEtcd(t *testing.T) {
	for _, tc := range []struct {
		name string
		h2   bool
		want string
	}{
		{"HTTP/1.1", false, "it answers HTTP/1.x, not etcd's gRPC"},
		{"HTTP/2", true, "answered HTTP 404 (Not Found), not etcd's gRPC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 10 * time.Second}
			if tc.h2 {
				srv.Protocols = new(http.Protocols)
				srv.Protocols.SetHTTP1(true)
				srv.Protocols.SetUnencryptedHTTP2(true)
			}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			checkNotEtcd(t, "http://"+ln.Addr().String(), tc.want)
		})
	}
	t.Run("gRPC without etcd", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
		checkNotEtcd(t, "http://"+ln.Addr().String(), "answered gRPC without etcd's services (etcdserverpb.KV is unknown there), not etcd's gRPC")
	})
}

// checkNotEtcd runs lease list against endpoint, which is not etcd: exit
// 1 with want and what to check, and none of gRPC's own words.
func checkNotEtcd(t *testing.T, endpoint, want string) {
	t.Helper()
	r := run(t, endpoint, "", "lease", "list")
	if r.code != exitError || !strings.Contains(r.err, want) || !strings.Contains(r.err, "check that --endpoints names etcd's client port") {
		t.Errorf("lease list: exit %d, stderr %q; want exit 1, %q and what to check", r.code, r.err, want)
	}
	for _, raw := range []string{"rpc error", "desc =", "transport:", "data:", "unexpected HTTP status code", "unknown service"} {
		if strings.Contains(r.err, raw) {
			t.Errorf("gRPC's text %q reaches the user: %q", raw, r.err)
		}
	}
}

// TestEtcdErrorsNameTheVariableSet: an etcd settings error whose value came
// from the environment names the variable, as the user set no flag.
func TestEtcdErrorsNameTheVariableSet(t *testing.T) {
	r := runEnv(t, []string{"OVERLAY_ENDPOINTS=http://127.0.0.1:1", "OVERLAY_DIAL_TIMEOUT=1s"}, "lease", "list")
	if r.code != exitError || !strings.Contains(r.err, "check --endpoints") || !strings.Contains(r.err, "set from the environment: OVERLAY_ENDPOINTS") {
		t.Errorf("unreachable etcd from OVERLAY_ENDPOINTS: exit %d, stderr %q", r.code, r.err)
	}
}

// TestNoConfigSuggestsThePrefix: with no config at the prefix the message
// says to check --prefix before suggesting to create one.
func TestNoConfigSuggestsThePrefix(t *testing.T) {
	srv, _ := cluster(t)
	r := run(t, srv.Endpoint, "", "--prefix", "/other/network", "config", "get")
	if r.code != exitError || !strings.Contains(r.err, "no network config at /other/network/config: check that --prefix is the network's prefix") {
		t.Errorf("config get at an empty prefix: exit %d, stderr %q", r.code, r.err)
	}
}

// TestConfigGetRawPrintsTheStoredBytes: --raw prints the value exactly as
// stored, without a newline added (regression: one was).
func TestConfigGetRawPrintsTheStoredBytes(t *testing.T) {
	srv, _ := cluster(t)
	for _, stored := range []string{`{"Network":"10.244.0.0/16"}`, "{\"Network\": \"10.244.0.0/16\"}\n\n", "not json  "} {
		if _, err := srv.Client(t).Put(ctx(t), etcdv3.DefaultPrefix+"/config", stored); err != nil {
			t.Fatal(err)
		}
		if r := run(t, srv.Endpoint, "", "config", "get", "--raw"); r.code != exitOK || r.out != stored {
			t.Errorf("config get --raw of %q: exit %d, stdout %q, stderr %q", stored, r.code, r.out, r.err)
		}
	}
}

// TestWriteOutIsHonouredEverywhere: every command that prints a result
// prints it as JSON with -w json and as one row of fields with -w simple
// (reserve, revoke and version printed their sentence whatever -w said).
func TestWriteOutIsHonouredEverywhere(t *testing.T) {
	srv, reg := cluster(t)
	seed(t, reg)
	var v versionInfo
	r := run(t, "", "", "version", "-w", "json")
	if err := json.Unmarshal([]byte(r.out), &v); r.code != exitOK || err != nil || v.Version == "" || v.GoVersion == "" || v.Platform == "" {
		t.Errorf("version -w json: %+v (%v)", r, err)
	}
	if r := run(t, "", "", "version", "-w", "simple"); r.code != exitOK || len(strings.Fields(r.out)) != 3 {
		t.Errorf("version -w simple: %+v", r)
	}

	var res writeResult
	r = run(t, srv.Endpoint, "", "lease", "reserve", "10.244.50.0/24", "--public-ip", "198.18.0.50", "-w", "json")
	if err := json.Unmarshal([]byte(r.out), &res); r.code != exitOK || err != nil || res.Action != "reserved" || res.Subnet != "10.244.50.0/24" ||
		res.PublicIP != "198.18.0.50" || res.Key != etcdv3.DefaultPrefix+"/subnets/10.244.50.0-24" {
		t.Errorf("lease reserve -w json: %+v (%v) = %+v", r, err, res)
	}
	r = run(t, srv.Endpoint, "", "lease", "revoke", "10.244.50.0/24", "--dry-run", "-w", "simple")
	if want := "wouldRevoke 10.244.50.0/24 - 198.18.0.50 - - unknown\n"; r.code != exitOK || r.out != want {
		t.Errorf("lease revoke --dry-run -w simple: %+v, want stdout %q", r, want)
	}
	res = writeResult{}
	r = run(t, srv.Endpoint, "", "lease", "revoke", "10.244.50.0/24", "-w", "json")
	if err := json.Unmarshal([]byte(r.out), &res); r.code != exitOK || err != nil || res.Action != "revoked" || res.Subnet != "10.244.50.0/24" {
		t.Errorf("lease revoke -w json: %+v (%v) = %+v", r, err, res)
	}

	// -w simple splits by position: config's MTU is "0 (underlay MTU - 50)".
	r = run(t, srv.Endpoint, "", "config", "get", "-w", "simple")
	if r.code != exitOK || !strings.Contains(r.out, "Backend.MTU \"0 (underlay MTU - 50)\"\n") {
		t.Errorf("config get -w simple: %+v", r)
	}
}

// TestDaemonErrorsNameTheVariableSet: an error of the daemon that names a
// flag (--subnet-file, --iface …) also names the variable or flanneld's
// flag that set it, as the user set no flag of that name (it named the
// flag only).
func TestDaemonErrorsNameTheVariableSet(t *testing.T) {
	runDaemon := func(_ context.Context, cfg daemon.Config) error {
		return fmt.Errorf("--subnet-file %s: overlayd is running on this host", cfg.SubnetFile)
	}
	file := filepath.Join(t.TempDir(), "subnet.env")
	for _, tc := range []struct {
		environ, args []string
		want          string
	}{
		{[]string{"OVERLAY_SUBNET_FILE=" + file}, nil, " (set from the environment: OVERLAY_SUBNET_FILE)"},
		{[]string{"FLANNELD_SUBNET_FILE=" + file}, nil, " (set from the environment: FLANNELD_SUBNET_FILE)"},
		{nil, []string{"--subnet-file", file}, ""},
	} {
		r := runEnvWith(t, runDaemon, tc.environ, append([]string{"run", "--iface", testIface(t)}, tc.args...)...)
		if r.code != exitError || !strings.Contains(r.err, "--subnet-file "+file+": overlayd is running on this host"+tc.want+"\n") {
			t.Errorf("%q overlayd run %q: exit %d, stderr %q; want exit 1 and the error followed by %q", tc.environ, tc.args, r.code, r.err, tc.want)
		}
	}
	if namesFlag("--iface-regex x", "iface") || !namesFlag("--iface-regex x, --iface lo", "iface") || !namesFlag("see --iface", "iface") {
		t.Error("namesFlag mistakes a longer flag for --iface, or misses it")
	}
}
