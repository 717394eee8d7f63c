package main

import (
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"
)

// A command with --log-format (run, teardown) json writes its standard
// error as JSON lines only — what a log pipeline parsing every line
// expects: the environment warnings given before the daemon's logger
// exists and the error it exits on are records like the daemon's own.
// With text (and for the other commands) they stay the plain lines
// people read: "warning: …" and "Error: …".

// jsonLogs reports whether cmd logs JSON: its --log-format, as given on
// the command line or by OVERLAY_LOG_FORMAT. It is asked after a failure
// too, when flag parsing may have stopped before --log-format (args) or
// before the environment was read (environ).
func jsonLogs(cmd *cobra.Command, args, environ []string) bool {
	if cmd == nil {
		return false
	}
	f := cmd.Flags().Lookup("log-format")
	if f == nil {
		return false
	}
	if f.Changed {
		return strings.EqualFold(f.Value.String(), "json")
	}
	for i, a := range args {
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, "--log-format="); ok {
			return strings.EqualFold(v, "json")
		}
		if a == "--log-format" && i+1 < len(args) {
			return strings.EqualFold(args[i+1], "json")
		}
	}
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, env("log-format")+"="); ok {
			return strings.EqualFold(v, "json")
		}
	}
	return false
}

// writeWarnings writes the "warning: …" lines of text to w, as they are
// or, for a command logging JSON, one WARN record each. Like the text
// lines, and like writeExitError's record, they do not depend on
// --log-level: "--log-level error" would drop them silently.
func writeWarnings(w io.Writer, cmd *cobra.Command, environ []string, text string) {
	if text == "" {
		return
	}
	if !jsonLogs(cmd, nil, environ) {
		_, _ = io.WriteString(w, text)
		return
	}
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		log.Warn(strings.TrimPrefix(line, "warning: "))
	}
}

// writeExitError reports the error the command exits on with code: an
// ERROR record {"msg":"exiting","error":…,"exit_code":…} for a command
// logging JSON (with "help" for a usage error), else "Error: …" and, for
// a usage error, where to find the usage.
func writeExitError(w io.Writer, cmd *cobra.Command, args, environ []string, err error, code int, helpPath string) {
	help := "Run '" + helpPath + " --help' for usage."
	if jsonLogs(cmd, args, environ) {
		attrs := []any{"error", err.Error(), "exit_code", code}
		if code == exitUsage {
			attrs = append(attrs, "help", help)
		}
		slog.New(slog.NewJSONHandler(w, nil)).Error("exiting", attrs...)
		return
	}
	_, _ = io.WriteString(w, "Error: "+err.Error()+"\n")
	if code == exitUsage {
		_, _ = io.WriteString(w, help+"\n")
	}
}
