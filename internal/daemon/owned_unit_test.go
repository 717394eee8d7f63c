package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/subnet"
)

func mustConfig(t *testing.T, raw string) *subnet.Config {
	t.Helper()
	c, err := subnet.ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfigDrift(t *testing.T) {
	run := mustConfig(t, `{"Network":"10.244.0.0/16"}`)
	lease := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.7.0/24")}
	for _, tc := range []struct{ now, want string }{
		{`{"Network":"10.244.0.0/16"}`, ""},
		{`{"Network":"10.244.0.0/16","SubnetMin":"10.244.5.0","SubnetMax":"10.244.9.0"}`, ""}, // only new leases care
		{`{"Network":"10.244.0.0/16","Unknown":true,"Backend":{"Type":"vxlan","GBP":true}}`, ""},
		{`{"Network":"10.50.0.0/16"}`, "lease 10.244.7.0/24 is not a /24 inside Network 10.50.0.0/16: it is stranded"},
		{`{"Network":"10.244.0.0/16","SubnetLen":25}`, "is not a /25 inside Network 10.244.0.0/16: it is stranded"},
		{`{"Network":"10.0.0.0/8"}`, "Network 10.244.0.0/16 -> 10.0.0.0/8: the running device"},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":7}}`, "Backend.VNI 1 -> 7: "},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","Port":4789}}`, "Backend.Port 8472 -> 4789: "},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","MTU":1400}}`, "Backend.MTU 0 -> 1400: "},
		{`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}`, "Backend.DirectRouting false -> true: "},
		// Turning IPv6 on alone is rolled host by host: pending, not drift
		// (TestConfigWatchIPv6ToggleIsPending); with another change it is.
		{`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/48"}`, ""},
		{`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/48","Backend":{"Type":"vxlan","VNI":7}}`, "EnableIPv6 false -> true, Backend.VNI 1 -> 7: the running device"},
		{`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48"}`, "EnableIPv4 true -> false: this host's lease 10.244.7.0/24 does not fit the new network"},
	} {
		got := configDrift(run, mustConfig(t, tc.now), lease)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("drift to %s = %q, want %q", tc.now, got, tc.want)
		}
	}
}

func TestConfigWatchReportsEachChangeOnce(t *testing.T) {
	logs := &logBuffer{}
	w := configWatch{running: mustConfig(t, `{"Network":"10.244.0.0/16"}`), lease: subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.7.0/24")}, key: "/p/config",
		log: slog.New(slog.NewJSONHandler(logs, nil))}
	moved := subnet.ConfigUpdate{Config: mustConfig(t, `{"Network":"10.50.0.0/16"}`)}
	same := subnet.ConfigUpdate{Config: w.running}
	gone := subnet.ConfigUpdate{Err: errors.New("no network config at /p/config")}
	for i, u := range []subnet.ConfigUpdate{same, moved, moved, gone, gone, same, same} {
		reason, _ := w.update(u)
		if (u.Config == w.running) != (reason == "") {
			t.Errorf("update %d: reason %q", i, reason)
		}
	}
	if n := logs.count(t, "network config changed while running"); n != 2 {
		t.Errorf("%d warnings for two changes:\n%s", n, strings.Join(logs.lines(t), "\n"))
	}
	if n := logs.count(t, "network config matches the running one again"); n != 1 {
		t.Errorf("%d recoveries logged, want 1", n)
	}
}

// A running host that sees EnableIPv6 turned on or off alone stays ready
// (hosts program the IPv4 half of each other's keys during the roll) and
// reports the change as pending until it restarts; logged once each way.
func TestConfigWatchIPv6ToggleIsPending(t *testing.T) {
	lease := subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.7.0/24")}
	v4 := `{"Network":"10.244.0.0/16"}`
	dual := `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`
	for _, tc := range []struct{ run, now, want string }{
		{v4, dual, "EnableIPv6 false -> true in /p/config: this host carries IPv4 only until overlayd restarts here (its lease then gains an IPv6 subnet of fd00:10:244::/48); restart overlayd host by host"},
		{dual, v4, "EnableIPv6 true -> false in /p/config: this host keeps its IPv6 device until overlayd restarts here (which removes it and drops its lease's IPv6 subnet); restart overlayd host by host"},
	} {
		logs := &logBuffer{}
		w := configWatch{running: mustConfig(t, tc.run), lease: lease, key: "/p/config", log: slog.New(slog.NewJSONHandler(logs, nil))}
		toggled := subnet.ConfigUpdate{Config: mustConfig(t, tc.now)}
		for range 2 {
			if reason, pending := w.update(toggled); reason != "" || pending != tc.want {
				t.Errorf("%s -> %s: reason %q, pending %q; want ready, pending %q", tc.run, tc.now, reason, pending, tc.want)
			}
		}
		if reason, pending := w.update(subnet.ConfigUpdate{Config: w.running}); reason != "" || pending != "" {
			t.Errorf("back to the running config: reason %q, pending %q", reason, pending)
		}
		if n := logs.count(t, "network config changed while running; restart overlayd on this host to apply it"); n != 1 {
			t.Errorf("%d pending changes logged, want 1:\n%s", n, strings.Join(logs.lines(t), "\n"))
		}
		if n := logs.count(t, "network config matches the running one again"); n != 1 {
			t.Errorf("%d recoveries logged, want 1", n)
		}
	}
}

func TestEnvKeeperNoticesAndRepairs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "subnet.env")
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, true)
	k := newEnvKeeper(path, subnet.FormatOverlay, env)
	if p := k.problem(); !strings.Contains(p, "is missing") {
		t.Fatalf("before the first write: problem %q", p)
	}
	if _, err := k.ensure(); err != nil || k.problem() != "" {
		t.Fatalf("ensure: %v, problem %q", err, k.problem())
	}
	if err := os.WriteFile(path, []byte("OVERLAY_MTU=9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := k.problem(); !strings.Contains(p, "does not hold this host's lease") {
		t.Errorf("altered: problem %q", p)
	}
	if p, err := k.ensure(); err != nil || p == "" {
		t.Errorf("ensure after an alteration = %q, %v", p, err)
	}
	if got, _ := os.ReadFile(path); string(got) != string(env.Marshal()) {
		t.Errorf("rewritten as %q", got)
	}
	k.set(func(e *subnet.Env) { e.MTU = 1400 })
	if p := k.problem(); p == "" {
		t.Error("a new MTU is not a problem until written")
	}
	if _, err := k.ensure(); err != nil {
		t.Fatal(err)
	}
	if e, err := subnet.ReadEnv(path); err != nil || e.MTU != 1400 {
		t.Errorf("after a new MTU: %+v, %v", e, err)
	}
	// Unwritable: the reason says so, until the path is free again.
	os.Remove(path)
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := k.ensure(); err == nil {
		t.Fatal("ensure over a directory succeeded")
	}
	if p := k.problem(); !strings.Contains(p, "is not a regular file; cannot rewrite it: ") {
		t.Errorf("unwritable: problem %q", p)
	}
	os.Remove(path)
	if _, err := k.ensure(); err != nil || k.problem() != "" {
		t.Errorf("after the path was freed: %v, %q", err, k.problem())
	}
}

func TestHostLockIsExclusive(t *testing.T) {
	file := filepath.Join(t.TempDir(), "run", "subnet.env")
	l, err := lockHost(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockHost(file); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), LockFile(file)) {
		t.Fatalf("second lock = %v, want ErrRunning naming %s", err, LockFile(file))
	}
	other, err := lockHost(file + ".other")
	if err != nil {
		t.Fatalf("a daemon with another subnet file: %v", err)
	}
	other.release()
	l.release()
	l, err = lockHost(file)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	l.release()
}

// Only "another overlayd holds the lock" gets the advice to stop it, and
// never the advice to run a second daemon beside it (the two would share
// the nftables table); a lock that cannot be taken for another reason is
// reported as it is, naming the flag.
func TestLockFailureAdvice(t *testing.T) {
	dir := t.TempDir()
	run := func(subnetFile string) error {
		// Run fails at the lock, before it reaches for etcd.
		return Run(context.Background(), Config{NodeName: "h1", SubnetFile: subnetFile, Kernel: newFakeKernel()})
	}
	held := filepath.Join(dir, "run", "subnet.env")
	l, err := lockHost(held)
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	err = run(held)
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "stop it first") || strings.Contains(err.Error(), "--subnet-file") {
		t.Errorf("with the lock held: %v; want ErrRunning, advice to stop it, and none to run another", err)
	}

	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(filepath.Join(notADir, "subnet.env"))
	if err == nil || errors.Is(err, ErrRunning) || strings.Contains(err.Error(), "stop it") || !strings.Contains(err.Error(), "--subnet-file") {
		t.Errorf("with the lock's directory under a file: %v; want the cause, naming --subnet-file, without advice to stop anything", err)
	}
}

// A stored network that holds this host's public address is named as the
// problem, not as one more changed field (issue 28 item 1).
func TestConfigWatchNamesANetworkHoldingThisHost(t *testing.T) {
	w := configWatch{running: mustConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`),
		lease: subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.7.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:7::/64")}, key: "/p/config",
		public: []netip.Addr{netip.MustParseAddr("198.18.0.7"), netip.MustParseAddr("2001:db8::7")}, log: slog.New(slog.DiscardHandler)}
	for cfg, want := range map[string]string{
		`{"Network":"198.18.0.0/16"}`: "network config changed while running: /p/config: Network 198.18.0.0/16 holds this host's public address 198.18.0.7: every host would skip this host's lease under it",
		`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"2001:db8::/32"}`: "/p/config: IPv6Network 2001:db8::/32 holds this host's public address 2001:db8::7",
		`{"Network":"10.50.0.0/16"}`: "is not a /24 inside Network 10.50.0.0/16: it is stranded",
	} {
		if got, _ := w.update(subnet.ConfigUpdate{Config: mustConfig(t, cfg)}); !strings.Contains(got, want) {
			t.Errorf("stored %s: reason %q, want %q", cfg, got, want)
		}
	}
}
