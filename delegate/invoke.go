package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

// Runtime is what the delegate gets in its CNI_* environment variables.
// For the attachment verbs it is exactly what overlay-cni was given; GC sets
// the container ID and interface name of each stale attachment it deletes.
type Runtime struct {
	ContainerID string
	NetNS       string
	IfName      string
	Args        string // CNI_ARGS
	Path        string // CNI_PATH, where the delegate is looked up
}

// Invoker runs the delegate plugin and looks at the rest of the world
// overlay-cni depends on (overlayd's readiness, the container's
// namespace): the one seam between overlay-cni's logic and what it does
// not own. ExecInvoker is the real one; unit tests of the pure logic use a
// fake.
type Invoker interface {
	Add(ctx context.Context, plugin string, conf []byte, rt Runtime) (types.Result, error)
	Del(ctx context.Context, plugin string, conf []byte, rt Runtime) error
	Check(ctx context.Context, plugin string, conf []byte, rt Runtime) error
	Status(ctx context.Context, plugin string, conf []byte, rt Runtime) error
	GC(ctx context.Context, plugin string, conf []byte, rt Runtime) error
	// DaemonReady asks the local overlayd whether it is ready (STATUS).
	DaemonReady(ctx context.Context, addr string) error
	// InterfaceExists tells whether the container's namespace already has
	// the interface (ADD refuses to touch an existing attachment).
	InterfaceExists(netnsPath, ifname string) (bool, error)
}

// ExecInvoker execs delegate plugins the way the CNI spec's delegation
// protocol (and libcni's invoke.DelegateAdd and friends) does: the plugin is
// looked up in CNI_PATH, gets the configuration on stdin and this process's
// environment with CNI_COMMAND set to the verb; its stdout carries the
// result or a CNI error, and its stderr is passed on to ours.
//
// Unlike invoke.Delegate*, the other CNI_* variables come from the Runtime
// instead of this process's environment, so GC can delete a stale
// attachment without mutating the environment. It is written here rather
// than wrapping pkg/invoke because that package pulls OpenTelemetry,
// net/http and crypto/tls into the binary, whose package initialisation
// would run at every exec of overlay-cni, i.e. at every pod creation.
type ExecInvoker struct {
	stderr io.Writer
}

// NewExecInvoker returns an ExecInvoker whose delegates write their stderr
// to stderr (nil discards it).
func NewExecInvoker(stderr io.Writer) *ExecInvoker {
	if stderr == nil {
		stderr = io.Discard
	}
	return &ExecInvoker{stderr: stderr}
}

// Add runs the delegate's ADD and returns its result.
func (e *ExecInvoker) Add(ctx context.Context, plugin string, conf []byte, rt Runtime) (types.Result, error) {
	out, err := e.run(ctx, "ADD", plugin, conf, rt)
	if err != nil {
		return nil, err
	}
	res, err := decodeResult(conf, out)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnusableResult, err)
	}
	return res, nil
}

// errUnusableResult marks an ADD that ran but printed no usable CNI result.
var errUnusableResult = errors.New("unusable result")

// Del runs the delegate's DEL.
func (e *ExecInvoker) Del(ctx context.Context, plugin string, conf []byte, rt Runtime) error {
	_, err := e.run(ctx, "DEL", plugin, conf, rt)
	return err
}

// Check runs the delegate's CHECK.
func (e *ExecInvoker) Check(ctx context.Context, plugin string, conf []byte, rt Runtime) error {
	_, err := e.run(ctx, "CHECK", plugin, conf, rt)
	return err
}

// Status runs the delegate's STATUS.
func (e *ExecInvoker) Status(ctx context.Context, plugin string, conf []byte, rt Runtime) error {
	_, err := e.run(ctx, "STATUS", plugin, conf, rt)
	return err
}

// GC runs the delegate's GC.
func (e *ExecInvoker) GC(ctx context.Context, plugin string, conf []byte, rt Runtime) error {
	_, err := e.run(ctx, "GC", plugin, conf, rt)
	return err
}

// ErrPluginNotFound marks a delegate that is not in CNI_PATH.
var ErrPluginNotFound = errors.New("plugin not found")

// FindPlugin returns the first executable regular file named plugin in the
// directories of cniPath. A name with a path separator is refused: the
// configuration must not be able to run an arbitrary file.
func FindPlugin(plugin, cniPath string) (string, error) {
	if !validPluginName(plugin) {
		return "", fmt.Errorf("%w: %q is not a plugin name", ErrPluginNotFound, plugin)
	}
	for _, dir := range filepath.SplitList(cniPath) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, plugin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %q is not in CNI_PATH %q", ErrPluginNotFound, plugin, cniPath)
}

// execAttempts bounds the retries of an exec that fails with "text file
// busy" (a plugin binary being replaced in place while we start it).
const execAttempts = 4

func (e *ExecInvoker) run(ctx context.Context, verb, plugin string, conf []byte, rt Runtime) ([]byte, error) {
	path, err := FindPlugin(plugin, rt.Path)
	if err != nil {
		return nil, err
	}
	env := environ(verb, rt)
	var stdout, stderr bytes.Buffer
	for attempt := 1; ; attempt++ {
		stdout.Reset()
		stderr.Reset()
		cmd := exec.CommandContext(ctx, path)
		cmd.Env = env
		cmd.Stdin = bytes.NewReader(conf)
		cmd.Stdout = &stdout
		cmd.Stderr = &stderr
		err = cmd.Run()
		if errors.Is(err, syscall.ETXTBSY) && attempt < execAttempts {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
			continue
		}
		break
	}
	if stderr.Len() > 0 {
		_, _ = e.stderr.Write(stderr.Bytes())
	}
	if err != nil {
		return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// environ is this process's environment with the CNI_* variables of the
// request replacing ours (CNI_NETNS_OVERRIDE and the rest are inherited).
func environ(verb string, rt Runtime) []string {
	set := []string{
		"CNI_COMMAND=" + verb,
		"CNI_CONTAINERID=" + rt.ContainerID,
		"CNI_NETNS=" + rt.NetNS,
		"CNI_IFNAME=" + rt.IfName,
		"CNI_ARGS=" + rt.Args,
		"CNI_PATH=" + rt.Path,
	}
	env := make([]string, 0, len(os.Environ())+len(set))
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH":
			continue
		}
		env = append(env, kv)
	}
	return append(env, set...)
}

// pluginError turns a failed exec into the plugin's CNI error (from its
// stdout) or, failing that, a CNI error describing what happened.
func pluginError(err error, stdout, stderr []byte) error {
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return err // it did not even start
	}
	if len(bytes.TrimSpace(stdout)) > 0 {
		var te types.Error
		if jerr := json.Unmarshal(stdout, &te); jerr == nil && (te.Code != 0 || te.Msg != "") {
			return &te
		}
		return types.NewError(types.ErrInternal, fmt.Sprintf("plugin failed (%v) with unparsable output %q", err, truncate(stdout)), "")
	}
	if len(stderr) > 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("plugin failed (%v): %q", err, truncate(stderr)), "")
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("plugin failed with no error message: %v", err), "")
}

func truncate(b []byte) string {
	const max = 1024
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}

// decodeResult parses an ADD result. A result without a cniVersion is taken
// to be in the configuration's version, as libcni does.
func decodeResult(conf, out []byte) (types.Result, error) {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		return nil, fmt.Errorf("decode delegate configuration: %w", err)
	}
	var r struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("decode delegate result %q: %w", truncate(out), err)
	}
	ver := r.CNIVersion
	if ver == "" {
		ver = c.CNIVersion
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil || m == nil {
			return nil, fmt.Errorf("decode delegate result %q: not a JSON object", truncate(out))
		}
		m["cniVersion"], _ = json.Marshal(ver)
		fixed, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("decode delegate result: %w", err)
		}
		out = fixed
	}
	// Plugin.Add converts the result to the request's version, and the
	// CNI library's conversions crash on null entries.
	if err := checkResultLists(out); err != nil {
		return nil, fmt.Errorf("decode delegate result: %w", err)
	}
	res, err := create.Create(ver, out)
	if err != nil {
		return nil, fmt.Errorf("decode delegate result: %w", err)
	}
	return res, nil
}
