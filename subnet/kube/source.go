// Package kube is the Kubernetes lease source (`overlayd run
// --kube-subnet-mgr`), the second implementation of subnet.Source beside
// subnet/etcdv3, wire-compatible with flanneld's kube subnet manager: a
// node's subnets are its spec.podCIDRs (kube-controller-manager assigns
// them with --allocate-node-cidrs; overlayd never allocates), its lease
// value is a set of annotations on its Node (subnet/kube/nodes), and the
// network config is a file (net-conf.json, from a ConfigMap), checked as
// `overlayd config put` checks one.
//
//	Node objects ──shared informer──▶ dirty names ──Tracker──▶ subnet.Batch ──▶ daemon
//	own Node ◀──one merge patch (annotations)── Acquire, Keep
//	own Node status ◀──NetworkUnavailable=false── Keep (the data path is up)
//
// It uses exactly: get, list and watch on nodes; patch on nodes (the
// annotations) and on nodes/status (the condition). This package is the
// only one that links client-go: the daemon knows it as a subnet.Source.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/kube/nodes"
)

// Config is what the Kubernetes lease source is told.
type Config struct {
	// REST, if set, is how the API server is reached; else Kubeconfig
	// (--kubeconfig-file) and APIURL (--kube-api-url) say it, and with
	// neither the pod's service account does (in-cluster).
	REST               *rest.Config
	Kubeconfig, APIURL string
	// NodeName is this host's Node (--node-name, NODE_NAME).
	NodeName string
	// AnnotationPrefix is --kube-annotation-prefix (default
	// nodes.DefaultPrefix).
	AnnotationPrefix string
	// NetConfPath is the network config file (--net-config-path).
	NetConfPath string
	// SetNetworkUnavailable: set the node's NetworkUnavailable condition
	// to false once the data path is up (flanneld's
	// --set-node-network-unavailable, default true).
	SetNetworkUnavailable bool
	// ConfigPoll is how often NetConfPath is read again for WatchConfig
	// (default 10 s; a ConfigMap's update reaches the file within about a
	// minute anyway).
	ConfigPoll time.Duration
	Logger     *slog.Logger
}

// Errors IsFatal reports.
var (
	// ErrSettings: the API server cannot be reached as configured (a bad
	// kubeconfig, URL, or no in-cluster service account).
	ErrSettings = errors.New("kubernetes client settings")
	// ErrPodCIDR: this node's podCIDR does not fit the network config.
	ErrPodCIDR = errors.New("podCIDR does not fit the network config")
	// ErrPodCIDRChanged: this node's podCIDR changed while overlayd ran
	// (pods hold addresses of the old one).
	ErrPodCIDRChanged = errors.New("podCIDR changed")
)

// Source is the Kubernetes lease source. Its start-up steps are called
// from one goroutine in subnet.Source's order; Keep, Watch and
// WatchConfig then run on goroutines of their own. The informer runs
// from Connect to Close.
type Source struct {
	cfg Config
	ann nodes.Annotations
	cli *nodeClient

	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	stopped  chan struct{}

	netCfg *subnet.Config
	data   []byte // the config file as read by Config
	codec  subnet.DataChecker
	host   subnet.Host

	kick    chan struct{} // a node changed (buffer 1)
	ownKick chan struct{} // this node changed (buffer 1)

	mu      sync.Mutex
	dirty   map[string]bool
	tracker *nodes.Tracker
	lease   subnet.Lease // own, as published
	claimed bool
	created bool  // Acquire made this node take part (it did not before)
	problem error // KeyProblem
	liveErr error // the informer's last watch error, until the API answers again
	// onRestart is Watch's WatchOptions.OnRestart, told of each failed
	// watch of Nodes.
	onRestart func(string)
}

var _ subnet.Source = (*Source)(nil)

// NewSource returns a Kubernetes lease source; it connects in Connect.
func NewSource(cfg Config) *Source {
	if cfg.AnnotationPrefix == "" {
		cfg.AnnotationPrefix = nodes.DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ConfigPoll <= 0 {
		cfg.ConfigPoll = 10 * time.Second
	}
	return &Source{cfg: cfg, kick: make(chan struct{}, 1), ownKick: make(chan struct{}, 1), dirty: map[string]bool{}}
}

// Where names the API server and the node.
func (s *Source) Where() string {
	host := s.cfg.APIURL
	if s.cfg.REST != nil {
		host = s.cfg.REST.Host
	}
	if host == "" && s.cfg.Kubeconfig != "" {
		host = "the one of " + s.cfg.Kubeconfig
	}
	if host == "" {
		host = "in-cluster"
	}
	return fmt.Sprintf("the Kubernetes API (%s) for node %s", host, s.cfg.NodeName)
}

// Name is "kubernetes": readiness's condition of the API server's watch.
func (s *Source) Name() string { return "kubernetes" }

// Connect builds the client, checks that the API server answers for this
// node, and starts the informer on Nodes.
func (s *Source) Connect(ctx context.Context) error {
	if s.cli == nil {
		cli, ann, err := newClient(s.cfg)
		if err != nil {
			return err
		}
		s.cli, s.ann = cli, ann
	}
	if _, err := s.cli.get(ctx, s.cfg.NodeName); err != nil {
		return fmt.Errorf("get node %s: %w%s", s.cfg.NodeName, err, hint(err))
	}
	s.startInformer()
	return nil
}

// newClient builds the API client and the annotations cfg names.
func newClient(cfg Config) (*nodeClient, nodes.Annotations, error) {
	ann, err := nodes.NewAnnotations(cfg.AnnotationPrefix)
	if err != nil {
		return nil, ann, fmt.Errorf("%w: --kube-annotation-prefix: %w", ErrSettings, err)
	}
	rc := cfg.REST
	if rc == nil {
		if rc, err = clientcmd.BuildConfigFromFlags(cfg.APIURL, cfg.Kubeconfig); err != nil {
			return nil, ann, fmt.Errorf("%w: %w: set --kubeconfig-file or --kube-api-url, or run in a pod with a service account", ErrSettings, err)
		}
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "overlayd"
	cli, err := newNodeClient(rc)
	if err != nil {
		return nil, ann, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	return cli, ann, nil
}

// Read returns, read only, the network config (cfg.NetConfPath, checked as
// Config checks it) and every Node's lease as one listing of the Nodes
// judges them (this node's included, when its annotations make it one),
// for `overlayd doctor`: it lists nodes and writes nothing.
func Read(ctx context.Context, cfg Config) (*subnet.Config, subnet.Snapshot, error) {
	if cfg.AnnotationPrefix == "" {
		cfg.AnnotationPrefix = nodes.DefaultPrefix
	}
	_, netCfg, err := subnet.ReadNetConf(cfg.NetConfPath)
	if err != nil {
		return nil, subnet.Snapshot{}, err
	}
	codec, err := codecs.For(netCfg.Backend)
	if err != nil {
		return nil, subnet.Snapshot{}, err
	}
	cli, ann, err := newClient(cfg)
	if err != nil {
		return nil, subnet.Snapshot{}, err
	}
	// ResourceVersion "0": the API server answers from its cache.
	list, err := cli.list(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		h := hint(err)
		if h == "" {
			h = " (check that the API server answers at the address --kubeconfig-file or --kube-api-url names)"
		}
		return nil, subnet.Snapshot{}, fmt.Errorf("list the Nodes: %w%s", err, h)
	}
	all := make([]nodes.Node, 0, len(list.Items))
	var rev int64
	for i := range list.Items {
		all = append(all, *view(&list.Items[i]))
		rev = max(rev, nodes.Revision(list.Items[i].ResourceVersion))
	}
	snap := nodes.NewTracker(ann, netCfg, codec, "").Reset(all)
	snap.Revision = rev
	return netCfg, snap, nil
}

// hint says what to do about an API error.
func hint(err error) string {
	switch {
	case apierrors.IsNotFound(err):
		return " (no Node of that name: set --node-name, or NODE_NAME from the pod's spec.nodeName, to the kubelet's node name)"
	case apierrors.IsForbidden(err):
		return " (grant get, list, watch on nodes and patch on nodes and nodes/status: deploy/kubernetes/overlay-kube.yaml's ClusterRole)"
	case apierrors.IsUnauthorized(err):
		return " (the API server does not accept the credentials: check --kubeconfig-file or the service account token)"
	}
	return ""
}

// startInformer starts the shared informer on Nodes, once.
func (s *Source) startInformer() {
	if s.informer != nil {
		return
	}
	cli := s.cli
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cli.list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cli.watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &node{}, 0, cache.Indexers{})
	ours := strings.TrimSuffix(s.ann.Managed, "kube-subnet-manager")
	_ = inf.SetTransform(func(obj any) (any, error) { return slim(obj, ours), nil })
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.mu.Lock()
		s.liveErr = err
		restart := s.onRestart
		s.mu.Unlock()
		if restart != nil {
			restart(err.Error())
		}
		s.cfg.Logger.Warn("the watch of Nodes failed; the informer lists them again", "err", err)
	})
	mark := func(obj any) {
		name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.dirty[name] = true
		s.liveErr = nil // the API server delivered something
		s.mu.Unlock()
		poke(s.kick)
		if name == s.cfg.NodeName {
			poke(s.ownKick)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, obj any) { mark(obj) },
		DeleteFunc: mark,
	})
	ctx, cancel := context.WithCancel(context.Background())
	s.informer, s.stop, s.stopped = inf, cancel, make(chan struct{})
	go func() {
		defer close(s.stopped)
		inf.RunWithContext(ctx)
	}()
}

// slim keeps of a Node what the source reads: its name, resourceVersion,
// the annotations under the prefix ours, its podCIDRs and its
// NetworkUnavailable condition. With thousands of nodes, the rest (images,
// managed fields, addresses) would be most of the daemon's memory.
func slim(obj any, ours string) any {
	n, ok := obj.(*node)
	if !ok {
		return obj
	}
	out := &node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, UID: n.UID},
		Spec: nodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs}}
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, ours) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == condNetworkUnavailable {
			out.Status.Conditions = append(out.Status.Conditions, c)
		}
	}
	return out
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// node returns node name as the informer holds it (nil: none).
func (s *Source) node(name string) *node {
	obj, found, err := s.informer.GetStore().GetByKey(name)
	if err != nil || !found {
		return nil
	}
	n, _ := obj.(*node)
	return n
}

// view is the codec's view of n (nil: nil).
func view(n *node) *nodes.Node {
	if n == nil {
		return nil
	}
	return &nodes.Node{Name: n.Name, PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs, Annotations: n.Annotations, ResourceVersion: n.ResourceVersion}
}

// Config reads and checks the network config file, as `overlayd config
// put` checks a file (subnet.ParseConfig, then CheckStorable).
func (s *Source) Config(context.Context) (*subnet.Config, error) {
	data, cfg, err := subnet.ReadNetConf(s.cfg.NetConfPath)
	if err != nil {
		return nil, err
	}
	s.data = data
	return cfg, nil
}

// ConfigKey is the network config file.
func (s *Source) ConfigKey() string { return s.cfg.NetConfPath }

// LeaseName is "node/<name>" of the node holding sn, for messages.
func (s *Source) LeaseName(sn subnet.Subnets) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tracker != nil {
		if name := s.tracker.Node(sn); name != "" {
			return nodes.Key(name)
		}
	}
	return "the node with podCIDR " + sn.String()
}

// Claim waits until the informer has listed the nodes and this node has
// a podCIDR of each family the network carries (kube-controller-manager
// assigns it after the node registers); onWait says which wait.
func (s *Source) Claim(ctx context.Context, cfg *subnet.Config, host subnet.Host, onWait func(string)) error {
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		return err
	}
	s.netCfg, s.codec, s.host = cfg, codec, host
	s.mu.Lock()
	s.claimed = true
	s.mu.Unlock()
	say := func(reason string) {
		if onWait != nil {
			onWait(reason)
		}
	}
	say("listing the Nodes")
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return ctx.Err()
	}
	for {
		reason := s.ownReason()
		if reason == "" {
			return nil
		}
		say(reason)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", reason, ctx.Err())
		case <-s.ownKick:
		}
	}
}

// ownReason says why this node has no lease yet, "" if it has one.
func (s *Source) ownReason() string {
	n := s.node(s.cfg.NodeName)
	if n == nil {
		return "waiting for the Node " + s.cfg.NodeName + " to exist (the kubelet registers it)"
	}
	sn, err := nodes.PodCIDRs(*view(n))
	if err != nil {
		return "node " + s.cfg.NodeName + ": " + err.Error()
	}
	for _, f := range []struct {
		on   bool
		name string
		has  bool
	}{{s.netCfg.EnableIPv4, "IPv4", sn.IPv4.IsValid()}, {s.netCfg.EnableIPv6, "IPv6", sn.IPv6.IsValid()}} {
		if f.on && !f.has {
			return fmt.Sprintf("waiting for node %s to get an %s podCIDR (kube-controller-manager assigns them with --allocate-node-cidrs and a --cluster-cidr inside the network config's network)", s.cfg.NodeName, f.name)
		}
	}
	return ""
}

// Acquire takes this node's podCIDRs as its lease, publishes its
// annotations in one patch (if they differ), and returns every other
// node's lease.
func (s *Source) Acquire(ctx context.Context) (subnet.Lease, subnet.Snapshot, error) {
	n := s.node(s.cfg.NodeName)
	if reason := s.ownReason(); reason != "" || n == nil {
		return subnet.Lease{}, subnet.Snapshot{}, errors.New(reason)
	}
	l, err := s.ownLease(*view(n))
	if err != nil {
		return l, subnet.Snapshot{}, err
	}
	took := n.Annotations[s.ann.Managed] == "true"
	if err := s.publish(ctx, *view(n)); err != nil {
		return l, subnet.Snapshot{}, err
	}
	s.mu.Lock()
	s.created = s.created || !took
	s.lease = l
	s.tracker = nodes.NewTracker(s.ann, s.netCfg, s.codec, s.cfg.NodeName)
	clear(s.dirty) // what changes from here on is marked again
	var all []nodes.Node
	var rev int64
	for _, obj := range s.informer.GetStore().List() {
		if n, ok := obj.(*node); ok {
			all = append(all, *view(n))
			rev = max(rev, nodes.Revision(n.ResourceVersion))
		}
	}
	snap := s.tracker.Reset(all)
	s.mu.Unlock()
	snap.Revision = rev
	return l, snap, nil
}

// ownLease is this node's lease from its podCIDRs and the value it
// publishes; a podCIDR outside the network is fatal.
func (s *Source) ownLease(n nodes.Node) (subnet.Lease, error) {
	sn, err := nodes.PodCIDRs(n)
	if err != nil {
		return subnet.Lease{}, err
	}
	if !s.netCfg.EnableIPv4 {
		sn.IPv4 = netip.Prefix{}
	}
	if !s.netCfg.EnableIPv6 {
		sn.IPv6 = netip.Prefix{}
	}
	_, pub, err := s.ann.Publish(s.netCfg, s.host.Attrs, n)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("%w: %w", ErrPodCIDR, err)
	}
	l := subnet.Lease{Subnet: sn.IPv4, IPv6Subnet: sn.IPv6, Attrs: pub}
	if err := s.netCfg.Orphaned(l, s.codec); err != nil {
		return l, fmt.Errorf("%w: node %s's podCIDRs %s: %w: kube-controller-manager's --cluster-cidr and --node-cidr-mask-size must match %s's Network and SubnetLen", ErrPodCIDR, n.Name, sn, err, s.cfg.NetConfPath)
	}
	return l, nil
}

// publish patches this node's annotations to what it publishes, in one
// request, if any differs.
func (s *Source) publish(ctx context.Context, n nodes.Node) error {
	changed, _, err := s.ann.Publish(s.netCfg, s.host.Attrs, n)
	if err != nil || changed == nil {
		return err
	}
	if err := s.cli.patch(ctx, s.cfg.NodeName, "", types.MergePatchType, nodes.MergePatch(changed)); err != nil {
		return fmt.Errorf("patch node %s's annotations: %w%s", s.cfg.NodeName, err, hint(err))
	}
	s.cfg.Logger.Info("published this node's lease in its annotations", "node", s.cfg.NodeName, "annotations", len(changed))
	return nil
}
