package delegate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	cniversion "github.com/containernetworking/cni/pkg/version"
)

// Check verifies an attachment: its cache entry (or flannel's, for a pod
// flannel's plugin added: see cachedEntry) exists, subnet.env is there
// and still holds the lease the attachment was made from, and the delegate's
// CHECK (with the cached configuration and the runtime's prevResult) passes.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, att, err := loadAttachment(args)
	if err != nil {
		return err
	}
	if err := p.checkNetNS(args, "CHECK", true); err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return cniError(types.ErrInvalidNetworkConfig, nil, "CHECK of %s needs a prevResult: the runtime must pass the ADD result", att)
	}
	e, _, err := p.cachedEntry(conf, att)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return cniError(CodeNoCache, err, "%s has no cache entry in %s%s: it was not added by overlay-cni (or the entry was removed); recreate the pod", att, conf.DataDir, flannelToo(conf))
	case errors.Is(err, ErrCacheCorrupt):
		return cniError(CodeCacheCorrupt, err, "the cache entry of %s is corrupt: recreate the pod", att)
	case err != nil:
		return cniError(types.ErrIOFailure, err, "cannot read the cache entry of %s: check dataDir %s", att, conf.DataDir)
	}
	env, err := readEnv(conf.SubnetFile)
	if err != nil {
		return envNotReady(types.ErrTryAgainLater, conf.SubnetFile, err)
	}
	for _, l := range []struct{ what, was, now string }{
		{"lease", orNone(e.Delegate.Lease), orNone(env.Lease())},
		{"IPv6 lease", orNone(e.Delegate.IPv6Lease), orNone(env.IPv6Lease())},
	} {
		if l.was != l.now {
			return cniError(CodeLeaseChanged, nil,
				"the host's %s changed from %s to %s since %s was added: its address no longer routes; recreate the pod",
				l.what, l.was, l.now, att)
		}
	}
	cfg, err := withPrevResult(e.Delegate.Config, conf.CNIVersion, conf.PrevResult)
	if err != nil {
		return cniError(types.ErrDecodingFailure, err, "cannot pass the prevResult of %s to the delegate", att)
	}
	if err := p.invoker.Check(context.Background(), e.Delegate.Type, cfg, runtimeOf(args)); err != nil {
		return delegateError("CHECK", e.Delegate.Type, err)
	}
	return nil
}

// withPrevResult returns the cached delegate configuration with prevResult
// set, converted to the cached configuration's cniVersion. A configuration
// of a version before CHECK existed (0.4.0) — flannel's plugin caches
// kube-flannel's 0.3.1, and the delegate refuses to CHECK that — is raised
// to the request's version (which has CHECK, or the runtime would not ask):
// CHECK changes nothing, and the keys are the same.
func withPrevResult(config []byte, version string, prev json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(config, &m); err != nil {
		return nil, err
	}
	var cachedVersion string
	if err := json.Unmarshal(m["cniVersion"], &cachedVersion); err != nil {
		return nil, fmt.Errorf("cached cniVersion: %w", err)
	}
	if hasCheck, err := cniversion.GreaterThanOrEqualTo(cachedVersion, "0.4.0"); err != nil {
		return nil, fmt.Errorf("cached cniVersion: %w", err)
	} else if !hasCheck {
		cachedVersion = version
		if m["cniVersion"], err = json.Marshal(version); err != nil {
			return nil, err
		}
	}
	conv, err := convertResult(version, prev, cachedVersion)
	if err != nil {
		return nil, fmt.Errorf("prevResult: %w", err)
	}
	if m["prevResult"], err = json.Marshal(conv); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// convertResult decodes a result (the runtime's prevResult) of version and
// converts it to toVersion. The CNI library's conversions dereference every
// entry of interfaces, ips and routes, so a null entry would crash the
// plugin: such a result is refused, and so is anything else that makes the
// library panic.
func convertResult(version string, raw json.RawMessage, toVersion string) (res types.Result, err error) {
	if err := checkResultLists(raw); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("cannot convert the result from %s to %s: %v", version, toVersion, r)
		}
	}()
	decoded, err := create.Create(version, raw)
	if err != nil {
		return nil, err
	}
	return decoded.GetAsVersion(toVersion)
}

// checkResultLists refuses a result with a null entry in interfaces, ips or
// routes (keys matched as the CNI library matches them, ignoring case).
func checkResultLists(raw []byte) error {
	var lists struct {
		Interfaces []json.RawMessage `json:"interfaces"`
		IPs        []json.RawMessage `json:"ips"`
		Routes     []json.RawMessage `json:"routes"`
	}
	if err := json.Unmarshal(raw, &lists); err != nil {
		return err
	}
	for _, l := range []struct {
		name string
		list []json.RawMessage
	}{{"interfaces", lists.Interfaces}, {"ips", lists.IPs}, {"routes", lists.Routes}} {
		for i, e := range l.list {
			if isAbsent(e) {
				return fmt.Errorf("%s[%d] is null", l.name, i)
			}
		}
	}
	return nil
}

// orNone names a lease for a message; the zero Prefix is "none".
func orNone(p netip.Prefix) string {
	if !p.IsValid() {
		return "none"
	}
	return p.String()
}

// flannelToo names flannel's cache directory for a message about a missing
// entry, when it was looked at.
func flannelToo(conf *NetConf) string {
	if conf.FlannelDataDir == "" {
		return ""
	}
	return " (nor in flannel's " + conf.FlannelDataDir + ")"
}
