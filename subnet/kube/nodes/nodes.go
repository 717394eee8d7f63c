// Package nodes is the Kubernetes lease source's codec, pure logic: what a
// Node says as a lease (its podCIDRs are its subnets, its annotations the
// lease value, as flanneld's kube subnet manager writes them), and what
// this host publishes on its own Node, as one merge patch. It links no
// Kubernetes client: subnet/kube turns the API's Node into a Node of this
// package, so the rules here are table-tested without an API server.
//
// A Node is untrusted input, exactly as an etcd lease is: whoever may
// patch Nodes chooses its annotations, and a podCIDR is whatever the
// controller (or an operator) wrote. Check decodes one and judges it with
// the same rules as an etcd lease (subnet.Config.CheckLease: the backend
// data, the public address outside the network, the subnet inside it and
// of its length), so a hostile Node is skipped with an error naming it,
// never programmed.
//
// The annotations, under a prefix (default flannel.alpha.coreos.com),
// are flanneld's (pkg/subnet/kube/annotations.go):
//
//	<prefix>/kube-subnet-manager  "true": the node takes part
//	<prefix>/backend-type         "vxlan"
//	<prefix>/backend-data         {"VNI":1,"VtepMAC":"0e:…"}, as in etcd
//	<prefix>/public-ip            the IPv4 VTEP address
//	<prefix>/backend-v6-data      the IPv6 device's data (dual stack)
//	<prefix>/public-ipv6          the IPv6 VTEP address
//	<prefix>/public-ip-overwrite  set by an operator: published as public-ip
//	<prefix>/public-ipv6-overwrite  likewise for public-ipv6
package nodes

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/overlaynet/overlay/subnet"
)

// DefaultPrefix is flanneld's --kube-annotation-prefix default.
const DefaultPrefix = "flannel.alpha.coreos.com"

// Node is what the codec reads of a Kubernetes Node.
type Node struct {
	Name string
	// PodCIDR is spec.podCIDR, PodCIDRs spec.podCIDRs (the first is
	// PodCIDR; dual stack has one of each family). PodCIDRs wins when set.
	PodCIDR  string
	PodCIDRs []string
	// Annotations are metadata.annotations.
	Annotations map[string]string
	// ResourceVersion is metadata.resourceVersion (the lease's
	// ModRevision, see Revision).
	ResourceVersion string
}

// Annotations are the names of the annotations under one prefix.
type Annotations struct {
	Prefix                                 string // as given, for messages
	Managed, BackendType                   string
	BackendData, BackendV6Data             string
	PublicIP, PublicIPv6                   string
	PublicIPOverwrite, PublicIPv6Overwrite string
}

// ErrPrefix marks a bad annotation prefix.
var ErrPrefix = errors.New("bad annotation prefix")

// prefixForm is a Kubernetes annotation prefix as flanneld accepts one: a
// DNS name (lower case), a '/', then optionally a name part ending in '-'.
var prefixForm = regexp.MustCompile(`^(?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?$`)

// NewAnnotations returns the annotation names under prefix, completed as
// flanneld completes it: "example.com" names example.com/backend-data,
// "example.com/net" names example.com/net-backend-data.
func NewAnnotations(prefix string) (Annotations, error) {
	p := prefix
	switch strings.Count(p, "/") {
	case 0:
		p += "/"
	case 1:
	default:
		return Annotations{}, fmt.Errorf("%w %q: at most one '/' (a DNS name, optionally followed by /NAME)", ErrPrefix, prefix)
	}
	if !strings.HasSuffix(p, "/") && !strings.HasSuffix(p, "-") {
		p += "-"
	}
	if !prefixForm.MatchString(p) {
		return Annotations{}, fmt.Errorf("%w %q: want a lower-case DNS name, optionally followed by /NAME, such as %s", ErrPrefix, prefix, DefaultPrefix)
	}
	return Annotations{
		Prefix:              prefix,
		Managed:             p + "kube-subnet-manager",
		BackendType:         p + "backend-type",
		BackendData:         p + "backend-data",
		BackendV6Data:       p + "backend-v6-data",
		PublicIP:            p + "public-ip",
		PublicIPv6:          p + "public-ipv6",
		PublicIPOverwrite:   p + "public-ip-overwrite",
		PublicIPv6Overwrite: p + "public-ipv6-overwrite",
	}, nil
}

// TakesPart reports whether n has the annotation that makes it a node of
// the network (flanneld's and ours: kube-subnet-manager "true"). A node
// without it is not a peer and not invalid: its overlay has not started
// on it yet.
func (a Annotations) TakesPart(n Node) bool { return n.Annotations[a.Managed] == "true" }

// ErrNode marks a node that cannot be a lease; it also wraps
// subnet.ErrInvalidLease.
var ErrNode = fmt.Errorf("%w: node", subnet.ErrInvalidLease)

func nodeError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrNode}, args...)...)
}

// MaxPodCIDRs is what Kubernetes allows: one subnet per family.
const MaxPodCIDRs = 2

// PodCIDRs reads n's podCIDRs: at most one of each family, each a network
// address with its prefix length. It returns zero for a family n has
// none of.
func PodCIDRs(n Node) (subnet.Subnets, error) {
	cidrs := n.PodCIDRs
	if len(cidrs) == 0 && n.PodCIDR != "" {
		cidrs = []string{n.PodCIDR}
	}
	if len(cidrs) > MaxPodCIDRs {
		return subnet.Subnets{}, nodeError("%d podCIDRs %q: want one per address family, at most two", len(cidrs), cidrs)
	}
	var s subnet.Subnets
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return subnet.Subnets{}, nodeError("podCIDR %q is not a subnet such as 10.244.7.0/24", c)
		}
		if p != p.Masked() {
			return subnet.Subnets{}, nodeError("podCIDR %q is not a network address (want %s)", c, p.Masked())
		}
		half := &s.IPv4
		if p.Addr().Is6() {
			half = &s.IPv6
		}
		if half.IsValid() {
			return subnet.Subnets{}, nodeError("podCIDRs %q name two subnets of one address family", cidrs)
		}
		*half = p
	}
	return s, nil
}

// Decode reads n as a lease of the network cfg: its podCIDR of each
// family cfg carries, and the annotations of those families as the lease
// value (Hostname: the node's name). It checks the form only (a podCIDR
// for each family, the annotations present); Check judges the values.
// ok is false for a node that does not take part (TakesPart).
func (a Annotations) Decode(cfg *subnet.Config, n Node) (l subnet.Lease, ok bool, err error) {
	if !a.TakesPart(n) {
		return l, false, nil
	}
	s, err := PodCIDRs(n)
	if err != nil {
		return l, true, err
	}
	if !cfg.EnableIPv4 {
		s.IPv4 = netip.Prefix{}
	}
	if !cfg.EnableIPv6 {
		s.IPv6 = netip.Prefix{}
	}
	l = subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6, Attrs: subnet.LeaseAttrs{
		BackendType: n.Annotations[a.BackendType], Hostname: n.Name}, ModRevision: Revision(n.ResourceVersion)}
	fams := []struct {
		on             bool
		sub            netip.Prefix
		name, ip, data string
		dstIP          *string
		dstData        *json.RawMessage
	}{
		{cfg.EnableIPv4, s.IPv4, "IPv4", a.PublicIP, a.BackendData, &l.Attrs.PublicIP, &l.Attrs.BackendData},
		{cfg.EnableIPv6, s.IPv6, "IPv6", a.PublicIPv6, a.BackendV6Data, &l.Attrs.PublicIPv6, &l.Attrs.BackendV6Data},
	}
	for _, f := range fams {
		if !f.on {
			continue
		}
		if !f.sub.IsValid() {
			return l, true, nodeError("it has no %s podCIDR (podCIDRs %q), but the network carries %s: kube-controller-manager assigns them with --allocate-node-cidrs and a --cluster-cidr of each family", f.name, podCIDRList(n), f.name)
		}
		ip, found := n.Annotations[f.ip]
		if !found {
			return l, true, nodeError("annotation %s is missing", f.ip)
		}
		data, found := n.Annotations[f.data]
		if !found {
			return l, true, nodeError("annotation %s is missing", f.data)
		}
		if len(data) > subnet.MaxLeaseValueSize {
			return l, true, nodeError("annotation %s holds %d bytes, more than %d", f.data, len(data), subnet.MaxLeaseValueSize)
		}
		*f.dstIP, *f.dstData = ip, json.RawMessage(data)
	}
	return l, true, nil
}

func podCIDRList(n Node) []string {
	if len(n.PodCIDRs) == 0 && n.PodCIDR != "" {
		return []string{n.PodCIDR}
	}
	return n.PodCIDRs
}

// Check is Decode followed by the rules every lease meets
// (subnet.Config.CheckLease with the backend's codec data): why n cannot
// be a peer, with the lease Decode read (its subnets name it in the daemon's
// books), or ok false for a node that does not take part.
func (a Annotations) Check(cfg *subnet.Config, data subnet.DataChecker, n Node) (l subnet.Lease, ok bool, err error) {
	l, ok, err = a.Decode(cfg, n)
	if !ok || err != nil {
		return l, ok, err
	}
	if err := cfg.CheckLease(l, data); err != nil {
		return l, true, fmt.Errorf("%w (annotations %s/…)", err, strings.TrimSuffix(a.Prefix, "/"))
	}
	return l, true, nil
}

// Publish is what this host writes on its own Node n for the lease value
// attrs (subnet.Host.Publishing's) of the network cfg: every annotation of
// the families cfg carries, with public-ip(v6) replaced by an operator's
// public-ip(v6)-overwrite. It returns the annotations that differ from
// n's (nil if none: nothing to patch) and the public addresses peers will
// use. An overwrite that is not a usable address of its family is an
// error naming it.
func (a Annotations) Publish(cfg *subnet.Config, attrs subnet.LeaseAttrs, n Node) (changed map[string]string, pub subnet.LeaseAttrs, err error) {
	want := map[string]string{a.Managed: "true", a.BackendType: attrs.BackendType}
	pub = attrs
	if cfg.EnableIPv4 {
		if pub.PublicIP, err = overwrite(n, a.PublicIPOverwrite, attrs.PublicIP, netip.Addr.Is4); err != nil {
			return nil, pub, err
		}
		want[a.PublicIP], want[a.BackendData] = pub.PublicIP, string(attrs.BackendData)
	}
	if cfg.EnableIPv6 {
		if pub.PublicIPv6, err = overwrite(n, a.PublicIPv6Overwrite, attrs.PublicIPv6, netip.Addr.Is6); err != nil {
			return nil, pub, err
		}
		want[a.PublicIPv6], want[a.BackendV6Data] = pub.PublicIPv6, string(attrs.BackendV6Data)
	}
	for k, v := range want {
		if old, found := n.Annotations[k]; found && old == v {
			continue
		}
		if changed == nil {
			changed = map[string]string{}
		}
		changed[k] = v
	}
	return changed, pub, nil
}

// overwrite is the public address to publish: the node's annotation name,
// if set, else own.
func overwrite(n Node, name, own string, family func(netip.Addr) bool) (string, error) {
	v, found := n.Annotations[name]
	if !found || v == "" {
		return own, nil
	}
	ip, err := netip.ParseAddr(v)
	if err == nil && !family(ip) {
		err = errors.New("is of the other address family")
	}
	if err == nil {
		err = subnet.CheckVTEPAddr(ip)
	}
	if err != nil {
		return "", fmt.Errorf("node %s: annotation %s %q: %v: fix or remove it (kubectl annotate node %s %s-)", n.Name, name, v, err, n.Name, name)
	}
	return ip.String(), nil
}

// MergePatch is the JSON merge patch (RFC 7386) that sets annotations on
// a Node: one request for all of them.
func MergePatch(annotations map[string]string) []byte {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}}) // strings only: cannot fail
	return patch
}
