package delegate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/lib/atomicfile"
	"github.com/overlaynet/overlay/subnet"
)

// Plugin implements overlay-cni's CNI verbs on top of an Invoker.
type Plugin struct {
	invoker Invoker
	stdout  io.Writer
	stderr  io.Writer
	// netns says why an existing CNI_NETNS is not a network namespace
	// (networkNamespace); unit tests whose namespaces are stand-in files
	// replace it.
	netns func(path string) error
}

// New returns a Plugin that runs delegates with inv, prints results to
// stdout and logs to stderr (nil means os.Stdout and os.Stderr).
func New(inv Invoker, stdout, stderr io.Writer) *Plugin {
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	return &Plugin{invoker: inv, stdout: stdout, stderr: stderr, netns: networkNamespace}
}

// Funcs returns the verbs for skel.PluginMainFuncs; all five are set, so the
// library never answers a verb with a silent success.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

func (p *Plugin) logf(format string, args ...any) {
	fmt.Fprintf(p.stderr, "overlay-cni: "+format+"\n", args...)
}

// loadConf parses the network configuration (code 7 on failure).
func loadConf(args *skel.CmdArgs) (*NetConf, error) {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return nil, cniError(types.ErrInvalidNetworkConfig, err,
			"invalid overlay-cni network configuration: fix the network config file (see Documentation/cni.md)")
	}
	return conf, nil
}

// loadAttachment parses the configuration and validates the container ID and
// interface name (code 4 when they could escape or collide in the cache).
func loadAttachment(args *skel.CmdArgs) (*NetConf, Attachment, error) {
	conf, err := loadConf(args)
	if err != nil {
		return nil, Attachment{}, err
	}
	a := Attachment{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	if err := a.Validate(); err != nil {
		return nil, Attachment{}, cniError(types.ErrInvalidEnvironmentVariables, err,
			"invalid CNI_CONTAINERID %q or CNI_IFNAME %q: the runtime must pass a plain container ID and interface name", args.ContainerID, args.IfName)
	}
	return conf, a, nil
}

// maxEnvFile bounds what is read of subnet.env (about 100 bytes in practice).
const maxEnvFile = 64 << 10

// readEnv reads subnet.env like subnet.ReadEnv, but only from a regular file
// of at most maxEnvFile bytes: subnetFile pointing at a FIFO, a device or a
// directory is an unusable file (the caller's code 11 or 50), not an open
// that blocks forever, a read of /dev/zero until memory runs out, or the
// side effect of opening a device (it is looked at with stat first).
func readEnv(path string) (subnet.Env, error) {
	if fi, err := os.Stat(path); err != nil {
		return subnet.Env{}, fmt.Errorf("read subnet file %s: %w", path, err)
	} else if !fi.Mode().IsRegular() {
		return subnet.Env{}, fmt.Errorf("read subnet file %s: %w (%v)", path, errNotRegular, fi.Mode().Type())
	}
	data, err := readRegular(path, maxEnvFile, 0)
	if err != nil {
		return subnet.Env{}, fmt.Errorf("read subnet file %s: %w", path, err)
	}
	e, err := subnet.ParseEnv(data)
	if err != nil {
		return subnet.Env{}, fmt.Errorf("subnet file %s: %w", path, err)
	}
	return e, nil
}

// checkNetNS refuses a CNI_NETNS that is a FIFO or a device: the CNI
// library opens CNI_NETNS after a successful ADD or DEL to compare it with
// the plugin's own namespace, and opening a FIFO blocks forever (opening a
// device may block or do anything). It is only stat'ed here.
//
// ADD and CHECK (needNS) work in the container's namespace, so for them an
// empty or missing CNI_NETNS, or a path that is not a network namespace (a
// regular file, a directory), is refused too, with code 4 and before
// anything is cached or delegated: the bridge plugin would fail with a
// bare error (code 999) after host-local had reserved an address, and its
// rollback DEL, failing the same way, would leave the cache entry behind.
// For DEL an empty or missing path is fine (the pod's namespace is gone:
// the delegate still releases its address), and so is one that is no
// namespace (Del passes both on empty).
//
// It also refuses the plugin's own network namespace, as the CNI library
// does for ADD and DEL, but before anything is cached or delegated: the
// library's own check comes after the verb ran. After an ADD the runtime
// would get a result followed by an error on stdout and an attachment
// nobody asked to keep; after a DEL the delegate would already have
// deleted the host's interface named CNI_IFNAME, again on every retry.
func (p *Plugin) checkNetNS(args *skel.CmdArgs, verb string, needNS bool) error {
	if args.Netns == "" {
		if needNS {
			return cniError(types.ErrInvalidEnvironmentVariables, nil,
				"CNI_NETNS is empty: %s needs the path of the container's network namespace (such as /var/run/netns/NAME or /proc/PID/ns/net)", verb)
		}
		return nil
	}
	if needNS {
		if err := p.netns(args.Netns); err != nil {
			return cniError(types.ErrInvalidEnvironmentVariables, nil,
				"invalid CNI_NETNS %q: %v; %s needs the path of the container's network namespace (such as /var/run/netns/NAME or /proc/PID/ns/net)", args.Netns, err, verb)
		}
	} else if fi, err := os.Stat(args.Netns); err != nil {
		return nil
	} else if err := notSpecial(fi); err != nil {
		return cniError(types.ErrInvalidEnvironmentVariables, nil, "invalid CNI_NETNS %q: %v", args.Netns, err)
	}
	if strings.ToUpper(args.NetnsOverride) == "TRUE" || args.NetnsOverride == "1" {
		return nil
	}
	if same, err := ns.CheckNetNS(args.Netns); err != nil {
		return err
	} else if same {
		return cniError(types.ErrInvalidNetNS, nil,
			"invalid CNI_NETNS %q: it is overlay-cni's own network namespace, not the container's", args.Netns)
	}
	return nil
}

// notSpecial refuses a FIFO or a device, which must never be opened.
func notSpecial(fi fs.FileInfo) error {
	if fi.Mode()&(fs.ModeNamedPipe|fs.ModeDevice|fs.ModeCharDevice) != 0 {
		return fmt.Errorf("a %v is not a network namespace", fi.Mode().Type())
	}
	return nil
}

// notNetNSError is networkNamespace's definite answer that there is no
// network namespace at the path: nothing is there (ENOENT, or ENOTDIR: a
// component of the path is no directory, so the path names nothing), or
// the file there is not on nsfs, or it is a namespace of another kind.
// Any other error (the file cannot be stat'ed, inspected or opened, say
// EACCES or EIO) says nothing about the namespace: it may be a pod's that
// still runs.
type notNetNSError struct{ reason string }

func (e *notNetNSError) Error() string { return e.reason }

// networkNamespace says why path is not a network namespace: a network
// namespace is a file of the kernel's nsfs (a bind mount such as
// /var/run/netns/NAME, or the link /proc/PID/ns/net), of the network
// kind. The path is stat'ed first, so a FIFO or a device is never opened,
// and only a file of nsfs is opened (to ask its kind). A *notNetNSError
// is a definite answer; any other error is not.
func networkNamespace(path string) error {
	return probeNetNS(path, os.Stat, unix.Statfs)
}

// probeNetNS is networkNamespace with its stat and statfs (unit tests give
// failing ones: as root, EACCES or EIO cannot be provoked on a real file).
func probeNetNS(path string, stat func(string) (fs.FileInfo, error), statfs func(string, *unix.Statfs_t) error) error {
	fi, err := stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR):
		return &notNetNSError{"no such file: the container's network namespace is gone, or the runtime passed a wrong path"}
	case err != nil:
		return fmt.Errorf("cannot be read: %w", err)
	}
	if err := notSpecial(fi); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := statfs(path, &st); err != nil {
		return fmt.Errorf("cannot be inspected: %w", err)
	}
	if st.Type != unix.NSFS_MAGIC {
		kind := "a regular file"
		switch {
		case fi.IsDir():
			kind = "a directory"
		case !fi.Mode().IsRegular():
			kind = "a special file"
		}
		return &notNetNSError{fmt.Sprintf("it is %s, not a network namespace", kind)}
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot be opened: %w", err)
	}
	defer f.Close()
	// NS_GET_NSTYPE needs Linux 4.11; older kernels are taken at their word.
	if kind, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err == nil && kind != unix.CLONE_NEWNET {
		return &notNetNSError{"it is a namespace of another kind, not a network namespace"}
	}
	return nil
}

func runtimeOf(args *skel.CmdArgs) Runtime {
	return Runtime{ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName, Args: args.Args, Path: args.Path}
}

// envNotReady is the ADD/CHECK error for a missing or unusable subnet.env.
func envNotReady(code uint, file string, err error) *types.Error {
	return cniError(code, err,
		"subnet file %s is missing or unusable: overlayd writes it once it holds this host's lease; start overlayd (or fix subnetFile) and try again", file)
}

// Add refuses an attachment that already exists (see refuseExisting), then
// renders the delegate configuration from the host's lease, caches it
// (before delegating, so that a DEL after a failed or interrupted ADD can
// still clean up), runs the delegate's ADD and prints its result in the
// requested cniVersion. The cache entry's fsyncs run while the delegate
// does, and the result is printed only once the entry is durable. If
// anything fails after the cache is written, the delegate's DEL runs before
// the error is returned (one deferred guard, as in the bridge plugin, so a
// new failure point cannot forget it).
func (p *Plugin) Add(args *skel.CmdArgs) (err error) {
	conf, att, err := loadAttachment(args)
	if err != nil {
		return err
	}
	if err := p.checkNetNS(args, "ADD", true); err != nil {
		return err
	}
	cache := Cache{Dir: conf.DataDir}
	if err := p.refuseExisting(cache, att, args); err != nil {
		return err
	}
	env, err := readEnv(conf.SubnetFile)
	if err != nil {
		return envNotReady(types.ErrTryAgainLater, conf.SubnetFile, err)
	}
	d, err := Render(conf, env)
	if err != nil {
		return cniError(types.ErrInvalidNetworkConfig, err, "cannot render the delegate configuration: fix the network config file")
	}
	cacheFailed := func(err error) *types.Error {
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return cniError(types.ErrIOFailure, err, "cannot cache the delegate configuration of %s in %s: its file system is full: free space there", att, conf.DataDir)
		}
		return cniError(types.ErrIOFailure, err, "cannot cache the delegate configuration of %s in %s: make dataDir writable by root", att, conf.DataDir)
	}
	pending, err := cache.Publish(att, d)
	if errors.Is(err, atomicfile.ErrExist) {
		// A concurrent ADD of the same attachment got there first (the
		// check above was before it): its ADD is left alone.
		return alreadyAttached(cache, att)
	}
	if err != nil {
		return cacheFailed(err)
	}
	synced := make(chan error, 1)
	go func() { synced <- pending.Sync() }()

	ctx := context.Background()
	rt := runtimeOf(args)
	// The cache entry exists from here on: every failure below is rolled back.
	defer func() {
		if err != nil {
			err = p.rollback(ctx, cache, att, d, rt, err)
		}
	}()
	res, err := p.invoker.Add(ctx, d.Type, d.Config, rt)
	syncErr := <-synced
	if err != nil {
		return delegateError("ADD", d.Type, err)
	}
	if syncErr != nil {
		return cacheFailed(syncErr)
	}
	out, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return cniError(CodeDelegateFailed, err,
			"the %s result cannot be converted to cniVersion %s: use a delegate that supports it", d.Type, conf.CNIVersion)
	}
	if err := out.PrintTo(p.stdout); err != nil {
		return cniError(types.ErrIOFailure, err, "cannot write the ADD result to stdout")
	}
	return nil
}

// rollback undoes a failed ADD with the delegate's DEL and returns cause,
// with the DEL's failure added to its details. The cache entry goes only if
// that DEL succeeded; otherwise it stays for the runtime's DEL.
func (p *Plugin) rollback(ctx context.Context, cache Cache, att Attachment, d Delegate, rt Runtime, cause error) error {
	if err := p.invoker.Del(ctx, d.Type, d.Config, rt); err != nil {
		p.logf("ADD of %s failed and so did the rollback DEL; the cache entry is kept for the runtime's DEL: %v", att, err)
		if te, ok := errors.AsType[*types.Error](cause); ok {
			te.Details = joinDetails(te.Details, "rollback DEL failed: "+err.Error())
		}
		return cause
	}
	if err := cache.Remove(att); err != nil {
		p.logf("ADD of %s rolled back, but its cache entry stays: %v", att, err)
	}
	return cause
}

func joinDetails(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// Del releases an attachment. It never needs the daemon: with a cache entry
// (overlay-cni's own, or flannel's for a pod flannel's plugin added, see
// cachedEntry) it replays the cached configuration through the delegate's
// DEL and removes the entry only if that succeeded; without a usable entry
// it re-renders the configuration from subnet.env and still runs the
// delegate's DEL; with neither there is nothing it could release, and it
// succeeds. An empty CNI_NETNS is passed on, and so is, as empty, one that
// is gone or no network namespace (the bridge plugin then only releases
// the address); one that cannot be looked at fails DEL with code 11.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, att, err := loadAttachment(args)
	if err != nil {
		return err
	}
	if err := p.checkNetNS(args, "DEL", false); err != nil {
		return err
	}
	ctx := context.Background()
	rt := runtimeOf(args)
	if rt.NetNS != "" {
		// A namespace that is gone, or a path that is none, is passed on
		// empty: the delegate then only releases the address (bridge
		// fails a DEL with a path that is not a namespace, and the
		// runtime would retry it for ever). Only a definite answer does
		// that: a path that cannot be looked at (EACCES, EIO) may be the
		// namespace of a pod that still runs, whose interface would stay
		// while host-local gave its address to another pod. That DEL
		// fails with "try again later", before the cache is touched.
		if err := p.netns(rt.NetNS); err != nil {
			var gone *notNetNSError
			if !errors.As(err, &gone) {
				return cniError(types.ErrTryAgainLater, err,
					"DEL of %s: CNI_NETNS %q %v, so whether the container's network namespace is still there is unknown; nothing was released (the cache entry is kept; DEL can be retried)", att, rt.NetNS, err)
			}
			p.logf("DEL of %s: CNI_NETNS %q: %v: releasing the address without entering it", att, rt.NetNS, err)
			rt.NetNS = ""
		}
	}

	e, store, err := p.cachedEntry(conf, att)
	if err == nil {
		if err := p.invoker.Del(ctx, e.Delegate.Type, e.Delegate.Config, rt); err != nil {
			te := delegateError("DEL", e.Delegate.Type, err)
			te.Msg += " (the cache entry is kept; DEL can be retried)"
			return te
		}
		if err := store.Remove(att); err != nil {
			p.logf("DEL of %s succeeded, but its cache entry stays (GC or the next DEL removes it): %v", att, err)
		}
		return nil
	}
	// An unusable entry goes once the DEL succeeded, unless it is another
	// attachment's (IDs with dashes can share a file name): that one is
	// left to its own DEL.
	removeEntry := store != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errOtherAttachment)
	if !errors.Is(err, fs.ErrNotExist) {
		p.logf("cannot use the cache entry of %s, re-rendering from %s instead: %v", att, conf.SubnetFile, err)
	}
	env, err := readEnv(conf.SubnetFile)
	if err != nil {
		p.logf("DEL of %s: no usable cache entry and %v: nothing to release", att, err)
		return nil
	}
	d, err := Render(conf, env)
	if err != nil {
		// An error here would fail every retry of the runtime's DEL (a pod
		// stuck terminating). ADD renders the same way before it caches
		// or delegates anything, so it made nothing with this pair.
		p.logf("DEL of %s: no usable cache entry, and the configuration cannot be rendered against %s (%v): nothing to release", att, conf.SubnetFile, err)
		return nil
	}
	if err := p.invoker.Del(ctx, d.Type, d.Config, rt); err != nil {
		return delegateError("DEL", d.Type, err)
	}
	if removeEntry {
		if err := store.Remove(att); err != nil {
			p.logf("DEL of %s succeeded, but its unusable cache entry stays: %v", att, err)
		}
	}
	return nil
}

// entryStore is where a cached delegate configuration was found, so that
// the entry is removed where it was.
type entryStore interface {
	Remove(Attachment) error
}

// cachedEntry returns the cached delegate configuration of att and the
// store it is in: overlay-cni's own entry, or — when there is none — the
// one flannel's CNI plugin left in FlannelDataDir for a pod it added before
// the conflist switched to overlay-cni. Errors are as Cache.Read's: a
// missing entry wraps fs.ErrNotExist, an unusable one (of either store)
// ErrCacheCorrupt. A file of flannel's that is unusable, or names another
// network, comes with no store: overlay-cni removes nothing in flannel's
// directory that it does not recognise as flannel's entry of this network
// (the directory is another program's, and a file there that is not JSON
// may be anything); one of another network also reads as missing.
func (p *Plugin) cachedEntry(conf *NetConf, att Attachment) (Entry, entryStore, error) {
	own := Cache{Dir: conf.DataDir}
	e, err := own.Read(att)
	if !errors.Is(err, fs.ErrNotExist) || conf.FlannelDataDir == "" {
		return e, own, err
	}
	flannel := FlannelCache{Dir: conf.FlannelDataDir}
	fe, ferr := flannel.Read(att)
	switch {
	case errors.Is(ferr, fs.ErrNotExist):
		return e, own, err
	case errors.Is(ferr, ErrOtherNetwork):
		p.logf("%s: %v; left alone", att, ferr)
		return e, nil, err
	case ferr != nil:
		p.logf("%s: %v; left in place", att, ferr)
		return fe, nil, ferr
	}
	p.logf("%s was added by flannel's CNI plugin: using its cached configuration", att)
	return fe, flannel, nil
}
