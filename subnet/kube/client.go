package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// nodeClient is the source's whole client: get, list, watch and patch of
// core/v1 Nodes over a REST client of /api/v1. Its scheme holds only
// Node and NodeList (this file's, not k8s.io/api/core/v1's) and meta/v1's
// options and Status. Neither client-go's kubernetes/scheme (every API
// group, registered at init) nor k8s.io/api/core/v1 (every core type,
// registered by its package's init) is linked: they made every etcd-mode
// overlayd pay for kube mode (Documentation/design.md, "What kube mode
// costs").
type nodeClient struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// newNodeClient returns the client of rc's API server; rc is not
// changed.
func newNodeClient(rc *rest.Config) (*nodeClient, error) {
	scheme := nodeScheme()
	rc = rest.CopyConfig(rc)
	rc.APIPath = "/api"
	rc.GroupVersion = &coreV1
	rc.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if rc.UserAgent == "" {
		rc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	cli, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, err
	}
	return &nodeClient{rc: cli, params: runtime.NewParameterCodec(scheme)}, nil
}

// nodeScheme holds node and nodeList as core/v1's Node and NodeList, and
// meta/v1's options and Status.
func nodeScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	// Named as the API server names them (AddKnownTypes would take the
	// Go names, node and nodeList).
	scheme.AddKnownTypeWithName(coreV1.WithKind("Node"), &node{})
	scheme.AddKnownTypeWithName(coreV1.WithKind("NodeList"), &nodeList{})
	metav1.AddToGroupVersion(scheme, coreV1)
	return scheme
}

func (c *nodeClient) get(ctx context.Context, name string) (*node, error) {
	n := &node{}
	err := c.rc.Get().Resource("nodes").Name(name).VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(n)
	return n, err
}

func (c *nodeClient) list(ctx context.Context, o metav1.ListOptions) (*nodeList, error) {
	l := &nodeList{}
	err := c.rc.Get().Resource("nodes").VersionedParams(&o, c.params).Timeout(timeout(o)).Do(ctx).Into(l)
	return l, err
}

func (c *nodeClient) watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	return c.rc.Get().Resource("nodes").VersionedParams(&o, c.params).Timeout(timeout(o)).Watch(ctx)
}

// patch patches node name (subresource: "" or "status") with a patch of
// type pt, as field manager overlayd.
func (c *nodeClient) patch(ctx context.Context, name, subresource string, pt types.PatchType, data []byte) error {
	req := c.rc.Patch(pt).Resource("nodes").Name(name)
	if subresource != "" {
		req = req.SubResource(subresource)
	}
	return req.VersionedParams(&metav1.PatchOptions{FieldManager: "overlayd"}, c.params).Body(data).Do(ctx).Error()
}

func timeout(o metav1.ListOptions) time.Duration {
	if o.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*o.TimeoutSeconds) * time.Second
}

// coreV1 is the core API group's version v1 (/api/v1).
var coreV1 = schema.GroupVersion{Version: "v1"}

// The condition this source reads and sets, and its value when the
// network is up (core/v1's NodeNetworkUnavailable and ConditionFalse).
const (
	condNetworkUnavailable = "NetworkUnavailable"
	condFalse              = "False"
)

// node is what the source reads of a core/v1 Node: its metadata, its
// podCIDRs and its conditions. The API server's JSON decodes into it as
// into core/v1's Node, the other fields left out.
type node struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              nodeSpec   `json:"spec,omitempty"`
	Status            nodeStatus `json:"status,omitempty"`
}

type nodeSpec struct {
	PodCIDR  string   `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

type nodeStatus struct {
	Conditions []nodeCondition `json:"conditions,omitempty"`
}

// nodeCondition is core/v1's NodeCondition, field for field.
type nodeCondition struct {
	Type               string      `json:"type"`
	Status             string      `json:"status"`
	LastHeartbeatTime  metav1.Time `json:"lastHeartbeatTime,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason             string      `json:"reason,omitempty"`
	Message            string      `json:"message,omitempty"`
}

// nodeList is core/v1's NodeList of nodes.
type nodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []node `json:"items"`
}

func (n *node) deepCopy() *node {
	out := &node{TypeMeta: n.TypeMeta}
	n.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.PodCIDR = n.Spec.PodCIDR
	if n.Spec.PodCIDRs != nil {
		out.Spec.PodCIDRs = append([]string(nil), n.Spec.PodCIDRs...)
	}
	if n.Status.Conditions != nil {
		// Each field is a value (metav1.Time holds a time.Time).
		out.Status.Conditions = append([]nodeCondition(nil), n.Status.Conditions...)
	}
	return out
}

// DeepCopyObject is runtime.Object's.
func (n *node) DeepCopyObject() runtime.Object { return n.deepCopy() }

// DeepCopyObject is runtime.Object's.
func (l *nodeList) DeepCopyObject() runtime.Object {
	out := &nodeList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]node, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].deepCopy()
		}
	}
	return out
}
