package etcdclient

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// The etcd messages configuration.md and troubleshooting.md quote are the
// ones the client prints, "…" standing for the endpoints (issue 28: the
// troubleshooting guide quoted "etcd at … did not answer within 5s", which
// nothing prints).
func TestDocumentedEtcdMessages(t *testing.T) {
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	docs := map[string]string{"configuration.md": read("configuration.md"), "troubleshooting.md": read("troubleshooting.md")}
	const ep = "https://10.0.0.11:2379"
	c := Config{Endpoints: []string{ep}, Username: "overlay"}
	for _, tc := range []struct {
		err    error
		elided bool // the document writes … for the endpoint
		docsIn []string
	}{
		{c.explainServer(rpctypes.ErrNoLeader), false, []string{"configuration.md"}},
		{c.explainServer(rpctypes.ErrAuthFailed), true, []string{"configuration.md"}},
		{c.explainTransport(context.DeadlineExceeded, nil, " within 5s"), true, []string{"configuration.md", "troubleshooting.md"}},
	} {
		msg := tc.err.Error()
		if tc.elided {
			msg = strings.ReplaceAll(msg, ep, "…")
		}
		// Documents wrap lines: compare with runs of white space as one.
		for _, name := range tc.docsIn {
			if !strings.Contains(strings.Join(strings.Fields(docs[name]), " "), "`"+msg+"`") {
				t.Errorf("%s does not quote the message `%s`", name, msg)
			}
		}
	}
}
