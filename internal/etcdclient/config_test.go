package etcdclient_test

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
)

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in, name, password string
	}{
		{"alice:s3cret", "alice", "s3cret"},
		{"alice", "alice", ""},
		{"alice:pass:with:colons", "alice", "pass:with:colons"},
		{"alice:", "alice", ""},
		{"", "", ""},
	} {
		name, password := etcdclient.ParseUser(tc.in)
		if name != tc.name || password != tc.password {
			t.Errorf("ParseUser(%q) = %q, %q; want %q, %q", tc.in, name, password, tc.name, tc.password)
		}
	}
}

// TestNewRefusesUnworkableSettings covers settings that New rejects before
// any network traffic. Each error is ErrConfig and names the offending
// flag or file, so the user knows what to change.
func TestNewRefusesUnworkableSettings(t *testing.T) {
	t.Parallel()
	pki := etcdtest.NewPKI(t)
	other := etcdtest.NewPKI(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("this is not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	unreadable := filepath.Join(dir, "unreadable.pem")
	if err := os.Mkdir(unreadable, 0o700); err != nil { // reading a directory fails even as root
		t.Fatal(err)
	}
	const ep = "https://127.0.0.1:2379"
	for _, tc := range []struct {
		name    string
		c       etcdclient.Config
		mention []string // in the message: the flag and file to fix
		is      error    // a further cause to match with errors.Is
	}{
		{name: "no endpoints", c: etcdclient.Config{}, mention: []string{"--endpoints"}},
		{name: "empty endpoint", c: etcdclient.Config{Endpoints: []string{ep, ""}}, mention: []string{"stray comma"}},
		{name: "unknown scheme", c: etcdclient.Config{Endpoints: []string{"htps://127.0.0.1:2379"}}, mention: []string{"htps", "https://"}},
		{name: "no port", c: etcdclient.Config{Endpoints: []string{"https://etcd.example"}}, mention: []string{"https://etcd.example", "host:port"}},
		{name: "password without user", c: etcdclient.Config{Endpoints: []string{ep}, Password: "x"}, mention: []string{"--user"}},
		{name: "user without password", c: etcdclient.Config{Endpoints: []string{ep}, Username: "alice"}, mention: []string{"alice", "--password"}},
		{name: "cert without key", c: etcdclient.Config{Endpoints: []string{ep}, Cert: pki.ClientCert}, mention: []string{"--key", pki.ClientCert}},
		{name: "key without cert", c: etcdclient.Config{Endpoints: []string{ep}, Key: pki.ClientKey}, mention: []string{"--cert", pki.ClientKey}},
		{name: "http endpoint with cacert", c: etcdclient.Config{Endpoints: []string{"http://127.0.0.1:2379"}, CACert: pki.CACert}, mention: []string{"http://127.0.0.1:2379", "https://"}},
		{name: "upper-case HTTP endpoint with cacert", c: etcdclient.Config{Endpoints: []string{"HTTP://127.0.0.1:2379"}, CACert: pki.CACert}, mention: []string{"HTTP://127.0.0.1:2379"}},
		{name: "http endpoint after https", c: etcdclient.Config{Endpoints: []string{ep, "http://127.0.0.2:2379"}}, mention: []string{"http://127.0.0.2:2379"}},
		{name: "http endpoint with client cert", c: etcdclient.Config{Endpoints: []string{"http://127.0.0.1:2379"}, Cert: pki.ClientCert, Key: pki.ClientKey}, mention: []string{"http://127.0.0.1:2379"}},
		{name: "missing cacert", c: etcdclient.Config{Endpoints: []string{ep}, CACert: missing}, mention: []string{"--cacert", missing}, is: fs.ErrNotExist},
		{name: "unreadable cacert", c: etcdclient.Config{Endpoints: []string{ep}, CACert: unreadable}, mention: []string{"--cacert", unreadable}},
		{name: "garbage cacert", c: etcdclient.Config{Endpoints: []string{ep}, CACert: garbage}, mention: []string{"--cacert", garbage}},
		{name: "key file as cacert", c: etcdclient.Config{Endpoints: []string{ep}, CACert: pki.ClientKey}, mention: []string{"--cacert", pki.ClientKey}},
		{name: "missing cert", c: etcdclient.Config{Endpoints: []string{ep}, Cert: missing, Key: pki.ClientKey}, mention: []string{"--cert", missing}, is: fs.ErrNotExist},
		{name: "garbage cert", c: etcdclient.Config{Endpoints: []string{ep}, Cert: garbage, Key: pki.ClientKey}, mention: []string{"--cert", garbage}},
		{name: "missing key", c: etcdclient.Config{Endpoints: []string{ep}, Cert: pki.ClientCert, Key: missing}, mention: []string{"--key", missing}, is: fs.ErrNotExist},
		{name: "garbage key", c: etcdclient.Config{Endpoints: []string{ep}, Cert: pki.ClientCert, Key: garbage}, mention: []string{"--key", garbage}},
		{name: "certificate as key", c: etcdclient.Config{Endpoints: []string{ep}, Cert: pki.ClientCert, Key: pki.ClientCert}, mention: []string{"--key", pki.ClientCert}},
		{name: "key of another certificate", c: etcdclient.Config{Endpoints: []string{ep}, Cert: pki.ClientCert, Key: other.ClientKey}, mention: []string{pki.ClientCert, other.ClientKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := etcdclient.New(tc.c)
			if err == nil {
				_ = cli.Close()
				t.Fatalf("New(%v) succeeded; want ErrConfig", tc.c)
			}
			if !errors.Is(err, etcdclient.ErrConfig) {
				t.Fatalf("New: %v; want ErrConfig", err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("New: %v; want it to wrap %v", err, tc.is)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

// TestNewAcceptsWorkableSettings: New makes no connection without a user,
// so these succeed with nothing listening.
func TestNewAcceptsWorkableSettings(t *testing.T) {
	t.Parallel()
	pki := etcdtest.NewPKI(t)
	for _, tc := range []struct {
		name string
		c    etcdclient.Config
	}{
		{"plaintext", etcdclient.Config{Endpoints: []string{"http://127.0.0.1:2379"}}},
		{"bare host:port", etcdclient.Config{Endpoints: []string{"127.0.0.1:2379"}}},
		{"bare host:port with TLS", etcdclient.Config{Endpoints: []string{"127.0.0.1:2379"}, CACert: pki.CACert}},
		{"https with system CAs", etcdclient.Config{Endpoints: []string{"https://127.0.0.1:2379"}}},
		{"upper-case HTTPS", etcdclient.Config{Endpoints: []string{"HTTPS://127.0.0.1:2379"}, CACert: pki.CACert}},
		{"IPv6", etcdclient.Config{Endpoints: []string{"https://[::1]:2379"}, CACert: pki.CACert}},
		{"mutual TLS", etcdclient.Config{Endpoints: []string{"https://127.0.0.1:2379", "https://localhost:2379"}, CACert: pki.CACert, Cert: pki.ClientCert, Key: pki.ClientKey}},
		{"unix socket", etcdclient.Config{Endpoints: []string{"unix:///run/etcd.sock"}}},
		{"unixs socket", etcdclient.Config{Endpoints: []string{"unixs:///run/etcd.sock"}, CACert: pki.CACert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := etcdclient.New(tc.c)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_ = cli.Close()
		})
	}
}

// TestConfigRedactsPassword: however a Config is printed or logged, the
// password is not in it.
func TestConfigRedactsPassword(t *testing.T) {
	const secret = "hunter2-do-not-print"
	c := etcdclient.Config{Endpoints: []string{"https://127.0.0.1:2379"}, Username: "alice", Password: secret}
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("etcd", "config", c)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("etcd", "config", c)
	for _, out := range []string{
		fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%s", c),
		fmt.Sprintf("%v", &c), logged.String(),
	} {
		if strings.Contains(out, secret) {
			t.Errorf("printed config %q contains the password", out)
		}
		if !strings.Contains(out, "alice") {
			t.Errorf("printed config %q lacks the user name", out)
		}
	}
	if diff := cmp.Diff("{Endpoints:[https://127.0.0.1:2379] CACert: Cert: Key: Username:alice Password:[redacted] DialTimeout:0s}", c.String()); diff != "" {
		t.Errorf("String() (-want +got):\n%s", diff)
	}
}
