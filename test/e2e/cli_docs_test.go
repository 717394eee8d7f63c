package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// docExample is one `$ command` line of a console block in a document and
// the lines printed after it.
type docExample struct {
	env  []string // VAR=value before the command
	args []string // after "overlayd"
	out  []string
}

// docExamples reads every `$ overlayd ...` example of file's console blocks.
func docExamples(t *testing.T, file string) map[string]docExample {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	examples := map[string]docExample{}
	var cur *docExample
	var key string
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```console"):
			inBlock = true
		case strings.HasPrefix(line, "```"):
			inBlock, cur = false, nil
		case !inBlock:
		case strings.HasPrefix(line, "$ "):
			cmd, _, _ := strings.Cut(strings.TrimPrefix(line, "$ "), "  #")
			key = strings.TrimSpace(cmd)
			ex := docExample{}
			for _, f := range strings.Fields(key) {
				switch {
				case len(ex.args) == 0 && strings.Contains(f, "=") && f != "overlayd":
					ex.env = append(ex.env, f)
				case f == "overlayd" && len(ex.args) == 0:
				default:
					ex.args = append(ex.args, f)
				}
			}
			examples[key] = ex
			cur = &ex
		case cur != nil && strings.TrimSpace(line) != "":
			cur.out = append(cur.out, line)
			examples[key] = *cur
		}
	}
	return examples
}

func example(t *testing.T, examples map[string]docExample, cmd string) docExample {
	t.Helper()
	ex, ok := examples[cmd]
	if !ok {
		t.Fatalf("the documentation has no example `$ %s` any more: update this test with it", cmd)
	}
	return ex
}

type cliRun struct {
	out, err string
	code     int
}

// overlayd runs the binary with the lab's etcd (unless args set
// --endpoints), an environment without OVERLAY_* variables but env, in
// host's namespace (nil: the caller's, which only talks to etcd's socket).
func overlayd(t *testing.T, l *lab.Lab, host *lab.Node, env []string, stdin string, args ...string) cliRun {
	t.Helper()
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--endpoints") }) {
		args = append([]string{"--endpoints=" + l.Endpoint()}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(30*time.Second))
	defer cancel()
	var r cliRun
	runIt := func() error {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, l.Binary("overlayd"), args...)
		cmd.Env = testenv.ProgramEnv(env...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
		err := cmd.Run()
		r = cliRun{stdout.String(), stderr.String(), 0}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			r.code = exit.ExitCode()
			return nil
		}
		return err
	}
	var err error
	if host != nil {
		err = lab.Do(host.NS, runIt)
	} else {
		err = runIt()
	}
	if err != nil {
		t.Fatalf("overlayd %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func lines(s string) []string {
	if s = strings.TrimRight(s, "\n"); s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// subst replaces the documentation's example values with the lab's.
func subst(ss []string, pairs ...string) []string {
	r := strings.NewReplacer(pairs...)
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = r.Replace(s)
	}
	return out
}

// sameFields compares table lines by their cells: column widths follow
// the content.
func sameFields(a, b string) bool { return slices.Equal(strings.Fields(a), strings.Fields(b)) }

func wantRun(t *testing.T, what string, got cliRun, code int, stdout, stderr []string) {
	t.Helper()
	if got.code != code {
		t.Errorf("%s: exit %d, want %d (stdout %q, stderr %q)", what, got.code, code, got.out, got.err)
	}
	if stdout != nil && !slices.Equal(lines(got.out), stdout) {
		t.Errorf("%s: stdout\n%s\nwant (as documented)\n%s", what, got.out, strings.Join(stdout, "\n"))
	}
	if stderr != nil && !slices.Equal(lines(got.err), stderr) {
		t.Errorf("%s: stderr\n%s\nwant (as documented)\n%s", what, got.err, strings.Join(stderr, "\n"))
	}
}

// The CLI examples of README.md and Documentation/configuration.md, run
// against a two-host lab: the messages they quote come out word for word
// (with the lab's subnets), the tables have the documented columns, and
// the exit codes are the documented ones (issue 13, "Done when").
func TestDocumentedCLIExamples(t *testing.T) {
	t.Parallel()
	readme := docExamples(t, "README.md")
	confDoc := docExamples(t, "Documentation/configuration.md")
	l := labtest.New(t, lab.Config{})
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// README, running on real hosts, step 1.
	netJSON := write("net.json", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	r := overlayd(t, l, nil, nil, "", "config", "put", "-f", netJSON)
	if r.code != 0 || lines(r.out)[0] != "stored /coreos.com/network/config" {
		t.Fatalf("config put -f net.json: %+v", r)
	}
	// README: a reservation, made before the hosts start so they leave it free.
	ex := example(t, readme, "overlayd lease reserve 10.244.50.0/24 --public-ip 198.18.0.50")
	wantRun(t, "README lease reserve", overlayd(t, l, nil, nil, "", ex.args...), 0, ex.out, []string{})

	nodes := labtest.Hosts(t, l, 2)
	h1, h2 := nodes[0], nodes[1]
	p1, p2 := lease(t, h1), lease(t, h2)
	s1, s2 := p1.String(), p2.String()
	// free returns doc if no host holds it, else another free subnet.
	free := func(doc string) string {
		for _, s := range []string{doc, "10.244.251.0/24", "10.244.252.0/24"} {
			if s != s1 && s != s2 {
				return s
			}
		}
		panic("unreachable")
	}
	keyForm := func(s string) string { return strings.Replace(s, "/", "-", 1) }

	// README: lease list — the documented columns, one row per lease.
	ex = example(t, readme, "overlayd lease list")
	r = overlayd(t, l, nil, nil, "", ex.args...)
	got := lines(r.out)
	if r.code != 0 || len(got) != 4 || !sameFields(got[0], ex.out[0]) {
		t.Fatalf("lease list: %+v; want the header %q and 3 rows", r, ex.out[0])
	}
	for _, row := range got[1:] {
		f := strings.Fields(row)
		want := map[string][]string{
			s1:               {s1, "198.18.0.1", f[2], "h1", f[4], "yes", "leased"},
			s2:               {s2, "198.18.0.2", f[2], "h2", f[4], "yes", "leased"},
			"10.244.50.0/24": {"10.244.50.0/24", "198.18.0.50", "-", "-", "reserved", "unknown", "reserved"},
		}[f[0]]
		if !slices.Equal(f, want) || len(f) != len(strings.Fields(ex.out[1])) {
			t.Errorf("lease list row %q, want %q (columns as in %q)", row, want, ex.out[1])
		}
	}

	// README: revoking a live host's lease is refused.
	ex = example(t, readme, "overlayd lease revoke 10.244.154.0/24")
	wantRun(t, "README lease revoke", overlayd(t, l, nil, nil, "", "lease", "revoke", s1), 1, []string{}, subst(ex.out, "10.244.154.0/24", s1))

	// README: status on h1, from its own overlayd.
	ex = example(t, readme, "overlayd status")
	r = overlayd(t, l, h1, nil, "", "status")
	if r.code != 0 {
		t.Errorf("status on h1: %+v", r)
	}
	var keys, docKeys []string
	for _, line := range lines(r.out) {
		keys = append(keys, strings.TrimSpace(line[:min(16, len(line))]))
	}
	for _, line := range ex.out {
		docKeys = append(docKeys, strings.TrimSpace(line[:min(16, len(line))]))
	}
	if n := slices.Index(docKeys, "ready"); n < 0 || !slices.Equal(keys[:n+1], docKeys[:n+1]) || !strings.Contains(r.out, "ready           yes") {
		t.Errorf("status rows %q, want the documented %q", keys, docKeys)
	}

	// configuration.md: config validate prints the effective config exactly.
	ex = example(t, confDoc, "overlayd config validate -f net.json")
	docJSON := write("doc-net.json", `{
  "Network": "10.244.0.0/16",
  "SubnetLen": 24,
  "SubnetMin": "10.244.1.0",
  "SubnetMax": "10.244.255.0",
  "Backend": {"Type": "vxlan", "VNI": 1, "Port": 8472, "DirectRouting": false, "MTU": 0}
}`)
	wantRun(t, "config validate", overlayd(t, l, nil, nil, "", "config", "validate", "-f", docJSON), 0, ex.out, []string{})
	// ... and its quoted errors.
	for cfg, msg := range map[string]string{
		`{"Network":"10.0.0.0/16","SubnetLen":17}`:            "invalid network config: SubnetLen 17 leaves fewer than four subnets in Network 10.0.0.0/16: use 18 or more",
		`{"Network":"10.244.0.0/16","SubnetLen":"24"}`:        `invalid network config: "SubnetLen": want a whole number such as 24, got "24"`,
		`{"Network":"10.244.0.0/16","SubnetLen":17} trailing`: "invalid network config: unexpected data after the JSON object",
	} {
		r := overlayd(t, l, nil, nil, cfg, "config", "put", "-f", "-")
		if r.code != 1 || !strings.Contains(r.err, msg) || !strings.HasSuffix(strings.TrimSpace(r.err), "; nothing was stored") {
			t.Errorf("config put %s: %+v; want exit 1 with %q", cfg, r, msg)
		}
	}

	// configuration.md: bad flag values are usage errors, before anything.
	for _, cmd := range []string{
		"overlayd lease list --endpoints ftp://10.0.0.1:2379",
		"overlayd run --health-addr bogus",
		"overlayd run --iface nope0",
		"overlayd run --iface lo",
		"OVERLAY_DIAL_TIMEOUT=soon overlayd lease list",
	} {
		ex := example(t, confDoc, cmd)
		wantRun(t, cmd, overlayd(t, l, h1, ex.env, "", ex.args...), 2, []string{}, ex.out)
	}
	// ... the environment never sets --force; unknown variables are named.
	ex = example(t, confDoc, "OVERLAY_FORCE=1 overlayd lease revoke 10.244.154.0/24")
	wantRun(t, "OVERLAY_FORCE=1 lease revoke", overlayd(t, l, nil, ex.env, "", "lease", "revoke", s1), 1, []string{}, subst(ex.out, "10.244.154.0/24", s1))
	ex = example(t, confDoc, "OVERLAY_ENDPONTS=http://10.0.0.1:2379 overlayd version")
	r = overlayd(t, l, nil, ex.env, "", ex.args...)
	wantRun(t, "unknown variable", r, 0, nil, ex.out)

	// configuration.md: lease reserve refuses a second subnet for a host.
	ex = example(t, confDoc, "overlayd lease reserve 10.244.60.0/24 --public-ip 198.18.0.1")
	s60 := free("10.244.60.0/24")
	wantRun(t, "reserve for a host with a lease", overlayd(t, l, nil, nil, "", subst(ex.args, "10.244.60.0/24", s60)...), 1, []string{},
		subst(ex.out, "10.244.60.0/24", s60, "10.244.1.0/24", s1, "10.244.1.0-24", keyForm(s1)))

	// configuration.md: lease list warns about an undecodable key, which
	// revoke then removes without --force.
	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxT(t, testenv.Deadline(30*time.Second))
	s9 := free("10.244.9.0/24")
	if _, err := cli.Put(ctx, "/coreos.com/network/subnets/"+keyForm(s9), "garbage"); err != nil {
		t.Fatal(err)
	}
	ex = example(t, confDoc, "overlayd lease list")
	r = overlayd(t, l, nil, nil, "", "lease", "list")
	warning := subst(ex.out[len(ex.out)-1:], "10.244.9.0-24", keyForm(s9))[0]
	if r.code != 0 || !sameFields(lines(r.out)[0], ex.out[0]) || !slices.Contains(lines(r.err), warning) {
		t.Errorf("lease list with a garbage key: %+v; want header %q and the warning %q", r, ex.out[0], warning)
	}
	if r := overlayd(t, l, nil, nil, "", "lease", "revoke", s9); r.code != 0 {
		t.Errorf("revoke the garbage key: %+v", r)
	}
	// --dry-run and --force --dry-run as the table says; the reservation goes.
	r = overlayd(t, l, nil, nil, "", "lease", "revoke", s2, "--force", "--dry-run")
	wantRun(t, "revoke --force --dry-run", r, 0, []string{"would revoke " + s2 + " (owner node h2 (198.18.0.2), alive yes)"}, []string{})
	wantRun(t, "revoke the reservation", overlayd(t, l, nil, nil, "", "lease", "revoke", "10.244.50.0/24"), 0,
		[]string{"revoked 10.244.50.0/24 (owner 198.18.0.50)"}, []string{})

	// configuration.md: a config that strands the hosts' leases is refused.
	ex = example(t, confDoc, "overlayd config put -f net-10.50.json")
	r = overlayd(t, l, nil, nil, `{"Network":"10.50.0.0/16"}`, "config", "put", "-f", "-")
	want := subst(ex.out, "10.244.1.0/24", s1, "10.244.2.0/24", s2)
	if p2.Addr().Less(p1.Addr()) { // listed in address order
		want[0], want[1] = want[1], want[0]
		want[2] = strings.Replace(want[2], "node h1 (198.18.0.1), node h2 (198.18.0.2)", "node h2 (198.18.0.2), node h1 (198.18.0.1)", 1)
	}
	wantRun(t, "config put stranding leases", r, 1, []string{}, want)
	if r := overlayd(t, l, nil, nil, "", "config", "get", "--raw"); strings.TrimSpace(r.out) != `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}` {
		t.Errorf("the refused config was stored: %q", r.out)
	}

	// configuration.md: turning IPv6 on is stored without --force, with
	// the note the procedure quotes (the last line of the example).
	ex = example(t, confDoc, "overlayd config put -f net-dual.json")
	r = overlayd(t, l, nil, nil, "", "config", "put", "-f", write("net-dual.json", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`))
	if r.code != 0 || lines(r.out)[0] != ex.out[0] || !slices.Equal(lines(r.err), ex.out[len(ex.out)-1:]) {
		t.Errorf("config put turning IPv6 on: %+v; want %q, then on stderr %q", r, ex.out[0], ex.out[len(ex.out)-1])
	}
}
