package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/daemon"
)

// jsonRecords parses stderr as JSON lines, failing on any other line.
func jsonRecords(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(stderr, "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("stderr line %q is not a JSON record (%v); stderr:\n%s", line, err, stderr)
		}
		recs = append(recs, rec)
	}
	return recs
}

// With --log-format json (as the DaemonSet and the env file set it) every
// line overlayd run writes is a JSON record: the environment warnings
// given before the daemon's logger exists and the error it exits on
// included. With text they are the plain lines.
func TestFatalErrorsAndWarningsReachJSONLogs(t *testing.T) {
	runDaemon := func(context.Context, daemon.Config) error {
		return errors.New("acquire a lease: no free subnet")
	}

	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
		code    int
		err     string
		warn    string
	}{
		{"fatal error, flag", []string{"OVERLAY_NOPE=1"}, []string{"run", "--log-format", "json", "--node-name", "h1"},
			exitError, "acquire a lease: no free subnet", "ignoring unknown environment variable OVERLAY_NOPE"},
		{"fatal error, environment", []string{"OVERLAY_LOG_FORMAT=json", "FLANNELD_NOPE=1"}, []string{"run", "--node-name", "h1"},
			exitError, "acquire a lease: no free subnet", "ignoring FLANNELD_NOPE: flanneld v0.28 has no such flag"},
		// --log-level is the daemon's: the warnings before it ran are
		// printed whatever it says, as in text.
		{"warnings with --log-level error", []string{"OVERLAY_NOPE=1"}, []string{"run", "--log-format", "json", "--log-level", "error", "--node-name", "h1"},
			exitError, "acquire a lease: no free subnet", "ignoring unknown environment variable OVERLAY_NOPE"},
		{"warnings with OVERLAY_LOG_LEVEL=error", []string{"OVERLAY_LOG_FORMAT=json", "OVERLAY_LOG_LEVEL=error", "FLANNELD_NOPE=1"}, []string{"run", "--node-name", "h1"},
			exitError, "acquire a lease: no free subnet", "ignoring FLANNELD_NOPE: flanneld v0.28 has no such flag"},
		{"usage error before --log-format is parsed", nil, []string{"run", "--lease-ttl", "1s", "--log-format=JSON"},
			exitUsage, "--lease-ttl", ""},
		{"usage error, environment", []string{"OVERLAY_LOG_FORMAT=json", "OVERLAY_LEASE_TTL=forever"}, []string{"run"},
			exitUsage, "OVERLAY_LEASE_TTL", ""},
		{"teardown", []string{"OVERLAY_LOG_FORMAT=json"}, []string{"teardown", "--vni", "0"},
			exitUsage, "--vni", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runEnvWith(t, runDaemon, tc.environ, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d: %+v", r.code, tc.code, r)
			}
			recs := jsonRecords(t, r.err)
			last := recs[len(recs)-1]
			if last["level"] != "ERROR" || last["msg"] != "exiting" || last["exit_code"] != float64(tc.code) ||
				!strings.Contains(last["error"].(string), tc.err) {
				t.Errorf("last record %v, want the exit error with %q", last, tc.err)
			}
			if _, ok := last["help"]; ok != (tc.code == exitUsage) {
				t.Errorf("record %v: help only for a usage error", last)
			}
			if tc.warn != "" && (len(recs) != 2 || recs[0]["level"] != "WARN" || !strings.Contains(recs[0]["msg"].(string), tc.warn)) {
				t.Errorf("records %v, want a WARN record %q first", recs, tc.warn)
			}
		})
	}

	// Text: the plain lines, as before.
	r := runEnvWith(t, runDaemon, []string{"OVERLAY_NOPE=1"}, "run", "--node-name", "h1")
	if r.code != exitError || r.err != "warning: ignoring unknown environment variable OVERLAY_NOPE (overlayd reads OVERLAY_<FLAG> only for the global flags and run's flags)\nError: acquire a lease: no free subnet\n" {
		t.Errorf("text: %+v", r)
	}
	// Commands without --log-format speak text whatever the environment.
	r = runEnv(t, []string{"OVERLAY_LOG_FORMAT=json"}, "lease", "get")
	if r.code != exitUsage || !strings.HasPrefix(r.err, "Error: ") {
		t.Errorf("lease get: %+v", r)
	}
}
