package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

var backticked = regexp.MustCompile("`([^`]+)`")

// readDoc returns a file of Documentation/.
func readDoc(t *testing.T, name string) string {
	t.Helper()
	return testenv.RepoFile(t, "Documentation/"+name)
}

// firstCell returns the backticked strings of a table row's first cell.
func firstCell(row []string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(row[0], -1) {
		out = append(out, m[1])
	}
	return out
}

// operations.md's table of startup reasons quotes each phase start-up
// reports as the code words it (placeholders in <>), and nothing else: a
// renamed or removed step fails here (issue 28: "setting up the VXLAN
// device" and a "trying to list leases" that no start-up step says).
func TestStartupReasonsAreDocumented(t *testing.T) {
	rows := testenv.MarkdownTable(t, readDoc(t, "operations.md"), "| `startup` reason |")
	var quoted []string
	for _, row := range rows {
		quoted = append(quoted, firstCell(row)...)
	}
	catchUp := strings.ReplaceAll(etcdv3.CatchUpReason, "%d", "%s")
	reach := stepReach + "etcd at " // etcdv3.Source.Where
	want := []string{
		phaseTrying + reach + "<endpoints>",
		phaseWaiting + reach + "<endpoints>: <why>",
		phaseTrying + stepClaimNodeID + `"<id>"`,
		phaseTrying + stepAcquire,
		phaseDevices,
		fmt.Sprintf(catchUp, "<R>", "<C>"),
	}
	for _, w := range want {
		if !slices.Contains(quoted, w) {
			t.Errorf("operations.md's startup table does not quote %q (it quotes %q)", w, quoted)
		}
	}
	// Reasons whose tail is an error of another package: their start.
	prefixes := []string{
		phaseWaiting + stepReadConfig + ": ",
		"duplicate node ID: ",
	}
	for _, q := range quoted {
		if strings.HasPrefix(q, "overlayd ") {
			continue // a command the reason names
		}
		if !slices.Contains(want, q) && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(q, p) }) {
			t.Errorf("operations.md's startup table quotes %q, which start-up never reports", q)
		}
	}
}

// Every metric the daemon registers is a row of operations.md's metrics
// table, with its type, and every overlay_* name any document mentions is
// a registered metric.
func TestMetricsAreDocumented(t *testing.T) {
	// A guard, so that the guard's series exist to be gathered.
	fams, err := newMetrics(&probe{guards: []Guard{fakeGuard{fam: backend.IPv4}}}).reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]string{}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "overlay_") {
			registered[f.GetName()] = strings.ToLower(f.GetType().String())
		}
	}
	if len(registered) == 0 {
		t.Fatal("no overlay_* metric registered")
	}
	documented := map[string]string{}
	for _, row := range testenv.MarkdownTable(t, readDoc(t, "operations.md"), "| metric | type |") {
		if len(row) < 2 {
			t.Fatalf("metrics row %q has no type", row)
		}
		for _, name := range firstCell(row) {
			documented[name] = row[1]
		}
	}
	for name, typ := range registered {
		switch got, ok := documented[name]; {
		case !ok:
			t.Errorf("metric %s is registered but not in operations.md's metrics table", name)
		case got != typ:
			t.Errorf("operations.md says metric %s is a %s; it is a %s", name, got, typ)
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			t.Errorf("operations.md's metrics table has %s, which is not registered", name)
		}
	}

	root := testenv.RepoRoot(t)
	docs, _ := filepath.Glob(filepath.Join(root, "Documentation", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	mention := regexp.MustCompile(`\boverlay_[a-z_]+[a-z]\b`)
	for _, doc := range docs {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range mention.FindAllString(string(data), -1) {
			if _, ok := registered[name]; !ok {
				t.Errorf("%s mentions the metric %s, which is not registered", filepath.Base(doc), name)
			}
		}
	}
}

// The --adopt-flannel log messages migrating-from-flannel.md quotes are
// logged word for word (issue 28: two were quoted without their prefix,
// one with the attribute of another in its place).
func TestAdoptFlannelLogMessagesAreDocumented(t *testing.T) {
	doc := readDoc(t, "migrating-from-flannel.md")
	src, err := os.ReadFile("flannel.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("`(--adopt-flannel: [^`]+)`").FindAllStringSubmatch(strings.Join(strings.Fields(doc), " "), -1) {
		n++
		if !strings.Contains(string(src), `d.log.Info("`+m[1]+`"`) {
			t.Errorf("migrating-from-flannel.md quotes the log message %q, which flannel.go does not log", m[1])
		}
	}
	if n < 3 {
		t.Errorf("migrating-from-flannel.md quotes %d --adopt-flannel log messages, want the 3 of a take-over", n)
	}
}
