package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var quotedInCell = regexp.MustCompile("`([^`]+)`")

// quotes returns the backticked strings of a cell.
func quotes(cell string) []string {
	var out []string
	for _, m := range quotedInCell.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// sameDefault says whether a documented default (one backticked value)
// is the flag's, durations compared by value (24h is 24h0m0s).
func sameDefault(doc string, f *pflag.Flag) bool {
	if doc == f.DefValue {
		return true
	}
	a, errA := time.ParseDuration(doc)
	b, errB := time.ParseDuration(f.DefValue)
	return errA == nil && errB == nil && a == b
}

// checkFlagTable compares the flags fs shows in --help (hidden ones, such
// as flanneld's aliases, left out) with the rows of a configuration.md
// table: each flag is in a row, each row's flags exist, and a default
// cell that is one backticked value is the flag's default. envCol, if not 0, is the
// column naming each flag's variable, in the order of the flag column.
func checkFlagTable(t *testing.T, what string, fs *pflag.FlagSet, rows [][]string, defCol, envCol int) {
	t.Helper()
	want := map[string]*pflag.Flag{}
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && f.Name != "help" {
			want[f.Name] = f
		}
	})
	documented := map[string]bool{}
	for _, row := range rows {
		var names []string
		for _, q := range quotes(row[0]) {
			if strings.HasPrefix(q, "--") {
				names = append(names, strings.TrimPrefix(q, "--"))
			}
		}
		var vars []string
		if envCol > 0 {
			vars = quotes(row[envCol])
			if len(vars) != len(names) {
				t.Errorf("%s: row %q names %d flags and %d variables", what, row[0], len(names), len(vars))
			}
		}
		for i, name := range names {
			documented[name] = true
			f, ok := want[name]
			if !ok {
				t.Errorf("%s documents --%s, which is not a flag of it (or is hidden)", what, name)
				continue
			}
			if envCol > 0 && i < len(vars) && vars[i] != env(name) {
				t.Errorf("%s: --%s is read from %s, not %s", what, name, env(name), vars[i])
			}
			if envCol > 0 && !readsEnv(f) {
				t.Errorf("%s: --%s is documented with a variable but is not read from the environment", what, name)
			}
			if def := quotes(row[defCol]); len(names) == 1 && len(def) == 1 && row[defCol] == "`"+def[0]+"`" && !sameDefault(def[0], f) {
				t.Errorf("%s: --%s defaults to %q, documented %q", what, name, f.DefValue, def[0])
			}
		}
	}
	for name := range want {
		if !documented[name] {
			t.Errorf("%s has --%s, which configuration.md's table does not document", what, name)
		}
	}
}

// configuration.md's tables of the global flags and of `overlayd run`'s
// flags list exactly the flags --help shows, with their variables and
// defaults.
func TestFlagTablesMatchTheFlags(t *testing.T) {
	doc := testenv.RepoFile(t, "Documentation/configuration.md")
	root := newRootCommand(program{})
	checkFlagTable(t, "the global flags", root.PersistentFlags(), testenv.MarkdownTable(t, doc, "| flag | environment | default | meaning |"), 2, 1)
	run, _, err := root.Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	checkFlagTable(t, "overlayd run", run.LocalNonPersistentFlags(), testenv.MarkdownTable(t, doc, "| flag | default | meaning |"), 1, 0)
}

// The shipped unit, its environment file and the DaemonSet set only
// variables overlayd reads, and the DaemonSet can set every etcd client
// setting operations.md says it takes (the password from its Secret).
func TestShippedFilesSetKnownVariables(t *testing.T) {
	root := newRootCommand(program{})
	known := map[string]bool{}
	for _, name := range []string{"", "run"} {
		cmd, _, err := root.Find(strings.Fields(name))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if readsEnv(f) {
				known[env(f.Name)] = true
			}
		})
		cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) {
			if readsEnv(f) {
				known[env(f.Name)] = true
			}
		})
	}
	variable := regexp.MustCompile(`\bOVERLAY_[A-Z0-9_]+`)
	files := map[string]string{}
	for _, path := range []string{"deploy/systemd/overlayd.service", "deploy/systemd/overlayd.env", "deploy/kubernetes/overlay.yaml"} {
		files[path] = testenv.RepoFile(t, path)
		for _, v := range variable.FindAllString(files[path], -1) {
			if !known[v] && v != "OVERLAY_<FLAG>" {
				t.Errorf("%s sets %s, which overlayd run does not read", path, v)
			}
		}
	}
	manifest := files["deploy/kubernetes/overlay.yaml"]
	for _, flag := range []string{"endpoints", "prefix", "cacert", "cert", "key", "user", "password"} {
		if !strings.Contains(manifest, env(flag)) {
			t.Errorf("deploy/kubernetes/overlay.yaml has no %s (set or commented out) for --%s", env(flag), flag)
		}
	}
	if !slices.ContainsFunc(strings.Split(manifest, "\n"), func(l string) bool {
		return strings.Contains(l, "secretKeyRef") && strings.Contains(l, "key: password")
	}) {
		t.Error("deploy/kubernetes/overlay.yaml does not take OVERLAY_PASSWORD from its Secret's password")
	}
}

// configuration.md's Environment section names every flag of teardown and
// status that is read from the environment (beside the global flags), and
// no other (issue 28: --iface-regex and --iface-can-reach were missing).
func TestEnvironmentSectionNamesTeardownAndStatusVariables(t *testing.T) {
	doc := testenv.RepoFile(t, "Documentation/configuration.md")
	const lead = "read the same variables for the flags they share with\n`run` ("
	_, after, ok := strings.Cut(doc, lead)
	if !ok {
		t.Fatalf("configuration.md's Environment section no longer says %q: update this test", lead)
	}
	list, _, _ := strings.Cut(after, ")")
	var documented []string
	for _, q := range quotes(list) {
		documented = append(documented, strings.TrimPrefix(q, "--"))
	}
	root := newRootCommand(program{})
	var want []string
	for _, name := range []string{"teardown", "status"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if readsEnv(f) && !slices.Contains(want, f.Name) {
				want = append(want, f.Name)
			}
		})
	}
	slices.Sort(want)
	slices.Sort(documented)
	if !slices.Equal(want, documented) {
		t.Errorf("configuration.md names %q as read from the environment by teardown and status; they read %q", documented, want)
	}
}

// --endpoints' help names every scheme the endpoint parser accepts, as
// configuration.md does (issue 28: it left out unixs://).
func TestEndpointsHelpNamesEveryScheme(t *testing.T) {
	usage := newRootCommand(program{}).PersistentFlags().Lookup("endpoints").Usage
	doc := testenv.RepoFile(t, "Documentation/configuration.md")
	for scheme, example := range map[string]string{
		"http://": "http://127.0.0.1:2379", "https://": "https://127.0.0.1:2379", "unix://": "unix:///run/etcd.sock", "unixs://": "unixs:///run/etcd.sock",
	} {
		if err := (&endpointsValue{eps: new([]string)}).Set(example); err != nil {
			t.Errorf("--endpoints %s: %v", example, err)
		}
		if !strings.Contains(usage, scheme) {
			t.Errorf("--endpoints' help %q does not name %s", usage, scheme)
		}
		if !strings.Contains(doc, "`"+scheme) {
			t.Errorf("configuration.md does not name the endpoint scheme %s", scheme)
		}
	}
}
