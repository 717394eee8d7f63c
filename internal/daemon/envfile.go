package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/overlaynet/overlay/subnet"
)

// envCheckInterval is how often subnet.env is compared with what the daemon
// wrote and rewritten if it was deleted or altered.
const envCheckInterval = 2 * time.Second

// envKeeper owns subnet.env: it writes it, and tells whether the file on
// disk is still what it wrote. The check is one stat(2) while nothing
// changed (same file, size and modification time as written); only then is
// the file read and compared.
type envKeeper struct {
	path   string
	format subnet.EnvFormat

	mu      sync.Mutex
	env     subnet.Env
	want    []byte
	written os.FileInfo // the file as last written or verified
	err     error       // the last write's error, until one succeeds
}

// newEnvKeeper keeps env at path in format (Config.SubnetFileFormat: ""
// is overlayd's own, "flannel" flanneld's for the tools that read that).
func newEnvKeeper(path string, format subnet.EnvFormat, env subnet.Env) *envKeeper {
	k := &envKeeper{path: path, format: format, env: env}
	k.want = k.render()
	return k
}

// render is the file's desired content. An unknown format renders nothing,
// which no file matches: ensure then tries to write it, and the write fails
// with the reason (so start-up does).
func (k *envKeeper) render() []byte {
	data, _ := k.env.MarshalFormat(k.format)
	return data
}

// set changes the desired content (e.g. a new MTU); ensure writes it.
func (k *envKeeper) set(f func(e *subnet.Env)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(&k.env)
	if want := k.render(); !bytes.Equal(want, k.want) {
		k.want, k.written = want, nil // compare the file's content again
	}
}

// problem says why the file is not what it should be; "" if it is.
func (k *envKeeper) problem() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.problemLocked()
}

func (k *envKeeper) problemLocked() string {
	fi, err := os.Stat(k.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k.withErr(k.path + " is missing")
	case err != nil:
		return k.withErr(err.Error())
	case !fi.Mode().IsRegular():
		return k.withErr(k.path + " is not a regular file")
	case k.written != nil && os.SameFile(fi, k.written) && fi.Size() == k.written.Size() && fi.ModTime().Equal(k.written.ModTime()):
		return k.withErr("")
	}
	data, err := os.ReadFile(k.path)
	switch {
	case err != nil:
		return k.withErr(err.Error())
	case !bytes.Equal(data, k.want):
		return k.withErr(k.path + " does not hold this host's lease and settings")
	}
	k.written = fi
	return k.withErr("")
}

// withErr adds the last write's failure (its innermost cause: the path is
// named already) to a reason.
func (k *envKeeper) withErr(reason string) string {
	if k.err == nil {
		return reason
	}
	cause := k.err
	for errors.Unwrap(cause) != nil {
		cause = errors.Unwrap(cause)
	}
	if reason == "" {
		return "cannot rewrite " + k.path + ": " + cause.Error()
	}
	return reason + "; cannot rewrite it: " + cause.Error()
}

// ensure rewrites the file if it is missing or differs, and reports what
// it found (problem "" if nothing was wrong) and the write's error.
func (k *envKeeper) ensure() (problem string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		if problem = k.problemLocked(); problem == "" {
			return "", nil
		}
	}
	if err = subnet.WriteEnvFormat(k.path, k.env, k.format); err == nil {
		k.written, err = os.Stat(k.path)
	}
	k.err = err
	if err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); !ok || pe.Path != k.path {
			k.err = fmt.Errorf("write %s: %w", k.path, err) // name the file, once
		}
		k.written = nil
	}
	return problem, k.err
}

// keep checks the file and logs what it repaired: the first failure to
// rewrite it and the recovery once each, not every check.
func (k *envKeeper) keep(log *slog.Logger) {
	k.mu.Lock()
	failing := k.err != nil
	k.mu.Unlock()
	problem, err := k.ensure()
	switch {
	case err != nil && !failing:
		log.Error("cannot rewrite subnet.env; pods cannot start until it is back", "path", k.path, "err", err)
	case err == nil && failing:
		log.Info("subnet.env rewritten", "path", k.path)
	case err == nil && problem != "":
		log.Warn("subnet.env was missing or altered; rewritten", "path", k.path, "found", problem)
	}
}
