package delegate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestShippedConflistCopiesAgree: the conflist in deploy/cni, the
// DaemonSet's ConfigMap and the one cni.md shows are the same, so the
// version choice documented is the one deployed.
func TestShippedConflistCopiesAgree(t *testing.T) {
	root := testenv.RepoRoot(t)
	read := func(rel string) string {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	decode := func(where, s string) any {
		var v any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		return v
	}
	want := decode("deploy/cni/10-overlay.conflist", read("deploy/cni/10-overlay.conflist"))

	var configMap string
	for _, doc := range strings.Split(read("deploy/kubernetes/overlay.yaml"), "\n---\n") {
		var obj struct {
			Kind     string                `json:"kind"`
			Metadata struct{ Name string } `json:"metadata"`
			Data     map[string]string     `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("deploy/kubernetes/overlay.yaml: %v", err)
		}
		if obj.Kind == "ConfigMap" && obj.Metadata.Name == "overlay-cni-config" {
			configMap = obj.Data["10-overlay.conflist"]
		}
	}
	if diff := cmp.Diff(want, decode("the ConfigMap overlay-cni-config", configMap)); diff != "" {
		t.Errorf("the DaemonSet's ConfigMap differs from deploy/cni/10-overlay.conflist (-want +got):\n%s", diff)
	}

	doc := read("Documentation/cni.md")
	start := strings.Index(doc, "```json\n{\"cniVersion\"")
	if start < 0 {
		t.Fatal("Documentation/cni.md shows no conflist")
	}
	block := doc[start+len("```json\n"):]
	block = block[:strings.Index(block, "```")]
	if diff := cmp.Diff(want, decode("the conflist in cni.md", block)); diff != "" {
		t.Errorf("Documentation/cni.md shows another conflist than deploy/cni/10-overlay.conflist (-want +got):\n%s", diff)
	}
}

// troubleshooting.md's section on pods failing while subnet.env is missing
// is titled with the start of the error ADD returns then (issue 28: it
// quoted a "… not ready" that ADD never says).
func TestTroubleshootingQuotesTheSubnetFileError(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	const title = `## Pods fail to start: "`
	_, quoted, ok := strings.Cut(string(data), title)
	if !ok {
		t.Fatalf("troubleshooting.md has no section %q any more: update this test", title)
	}
	quoted, _, _ = strings.Cut(quoted, `"`)
	msg := envNotReady(11, "/run/overlay/subnet.env", os.ErrNotExist).Msg
	if !strings.HasPrefix(msg, quoted) {
		t.Errorf("troubleshooting.md quotes %q; ADD says %q", quoted, msg)
	}
}

// security.md and cni.md state the cache file name's bound as the code
// applies it (issue 28: security.md said 255 bytes; names of 240–255 bytes
// are refused, so that the temporary file's name fits too).
func TestDocumentedCacheNameBound(t *testing.T) {
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(data)), " ")
	}
	for doc, want := range map[string]string{
		"security.md": fmt.Sprintf("cache file name ≤ %d bytes", maxFileName),
		"cni.md":      fmt.Sprintf("cache file name over %d bytes", maxFileName),
	} {
		if !strings.Contains(read(doc), want) {
			t.Errorf("%s does not say %q", doc, want)
		}
	}
}
