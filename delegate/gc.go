package delegate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// GC removes what belongs to attachments that are no longer valid: each
// cached attachment not in the valid list is deleted through the delegate
// (with an empty netns: the namespace is gone, or is no longer ours to
// touch) and its cache entry removed; so are flannel's cache entries of
// containers no longer valid (gcFlannel); then host-local reservations of
// invalid attachments are released under host-local's lock; then the GC is
// forwarded to the delegate. It continues past errors and reports them all.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := loadConf(args)
	if err != nil {
		return err
	}
	if !conf.HasValidAttachments {
		return cniError(types.ErrInvalidNetworkConfig, nil,
			"GC needs cni.dev/valid-attachments (an empty list to remove everything); refusing to guess")
	}
	pairs := make([][2]string, 0, len(conf.ValidAttachments))
	validFiles := map[string]bool{}
	for _, v := range conf.ValidAttachments {
		pairs = append(pairs, [2]string{v.ContainerID, v.IfName})
		validFiles[Attachment{Network: conf.Name, ContainerID: v.ContainerID, IfName: v.IfName}.fileName()] = true
	}
	valid := NewValidSet(pairs)
	ctx := context.Background()

	errs := p.gcCache(ctx, conf, valid, validFiles, args.Path)
	errs = append(errs, p.gcFlannel(conf, valid)...)
	released, err := SweepHostLocal(conf.HostLocalDir(), valid)
	if err != nil {
		errs = append(errs, fmt.Errorf("sweep host-local reservations in %s: %w", conf.HostLocalDir(), err))
	}
	for _, a := range released {
		p.logf("GC: released host-local reservation %s", a)
	}
	if err := p.forwardGC(ctx, conf, args.Path); err != nil {
		errs = append(errs, err)
	}

	if len(errs) > 0 {
		return cniError(CodeGCIncomplete, errors.Join(errs...),
			"GC of network %q left %d stale resource(s) behind: see the details; the next GC retries them", conf.Name, len(errs))
	}
	return nil
}

// gcCache deletes, through the delegate, each cached attachment of conf's
// network that is not valid, and removes its cache entry once that
// succeeded; an unusable entry is removed unless it is a valid
// attachment's (validFiles). It returns every failure.
func (p *Plugin) gcCache(ctx context.Context, conf *NetConf, valid ValidSet, validFiles map[string]bool, path string) []error {
	var errs []error
	listed, err := Cache{Dir: conf.DataDir}.List(conf.Name)
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range listed {
		if l.Err != nil && !errors.Is(l.Err, ErrCacheCorrupt) {
			errs = append(errs, l.Err)
			continue
		}
		if l.Err != nil {
			if validFiles[filepath.Base(l.Path)] {
				p.logf("GC: keeping the unusable cache entry of a valid attachment: %v", l.Err)
				continue
			}
			p.logf("GC: removing an unusable cache entry (host-local's sweep releases its address): %v", l.Err)
			if err := removeFile(l.Path); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		att := l.Entry.Attachment
		if valid.Has(att.ContainerID, att.IfName) {
			continue
		}
		rt := Runtime{ContainerID: att.ContainerID, IfName: att.IfName, Path: path}
		if err := p.invoker.Del(ctx, l.Entry.Delegate.Type, l.Entry.Delegate.Config, rt); err != nil {
			errs = append(errs, fmt.Errorf("delete stale %s: %w", att, err))
			continue
		}
		if err := removeFile(l.Path); err != nil {
			errs = append(errs, err)
			continue
		}
		p.logf("GC: deleted stale %s", att)
	}
	return errs
}

// forwardGC forwards the GC to the delegate, rendered against subnet.env.
// Without subnet.env, or with a configuration that cannot be rendered
// against it, no ADD can have succeeded since: the sweep of host-local's
// reservations did what the delegate's GC would (an error would fail
// every GC to come).
func (p *Plugin) forwardGC(ctx context.Context, conf *NetConf, path string) error {
	env, err := readEnv(conf.SubnetFile)
	var d Delegate
	if err == nil {
		d, err = Render(conf, env)
	}
	if err != nil {
		p.logf("GC: not forwarding GC to the delegate, its configuration cannot be rendered: %v", err)
		return nil
	}
	return p.delegateGC(ctx, d, conf.ValidAttachments, path)
}

// delegateGC forwards the GC to the delegate with the valid attachments.
func (p *Plugin) delegateGC(ctx context.Context, d Delegate, valid []types.GCAttachment, path string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(d.Config, &m); err != nil {
		return fmt.Errorf("render the delegate configuration for GC: %w", err)
	}
	list := valid
	if list == nil {
		list = []types.GCAttachment{}
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return fmt.Errorf("encode the valid attachments: %w", err)
	}
	m["cni.dev/valid-attachments"] = raw
	m["cni.dev/attachments"] = raw
	cfg, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("render the delegate configuration for GC: %w", err)
	}
	if err := p.invoker.GC(ctx, d.Type, cfg, Runtime{Path: path}); err != nil {
		return fmt.Errorf("delegate %s GC: %w", d.Type, err)
	}
	return nil
}

// gcFlannel removes the entries flannel's CNI plugin left in its cache
// for this network's containers that have no valid attachment. Entries of
// valid containers and of other networks are kept, and so are files that
// are not recognisably flannel's entries (they are logged): overlay-cni
// removes nothing it does not recognise in another program's directory.
// No delegate DEL is run for the stale ones: flannel's entry names no
// interface, so host-local could not match the reservation; the sweep
// after this releases it by (containerID, ifname) as host-local's store
// has it, and the veth went with the pod's namespace.
func (p *Plugin) gcFlannel(conf *NetConf, valid ValidSet) []error {
	if conf.FlannelDataDir == "" {
		return nil
	}
	listed, err := FlannelCache{Dir: conf.FlannelDataDir}.List()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range listed {
		switch {
		case valid.HasContainer(l.ContainerID):
			continue
		case errors.Is(l.Err, ErrCacheCorrupt):
			p.logf("GC: leaving alone a file in flannel's cache that is not a usable entry: %v", l.Err)
			continue
		case l.Err != nil:
			errs = append(errs, l.Err)
			continue
		case l.Network != conf.Name:
			continue
		}
		if err := removeFile(l.Path); err != nil {
			errs = append(errs, err)
			continue
		}
		p.logf("GC: removed flannel's cache entry of stale container %q (host-local's sweep releases its address): %s", l.ContainerID, l.Path)
	}
	return errs
}

func removeFile(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove cache entry: %w", err)
	}
	return nil
}
