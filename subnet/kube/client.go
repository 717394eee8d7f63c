package kube

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// nodeClient is the source's whole client: get, list, watch and patch of
// core/v1 Nodes over a REST client of /api/v1. Its scheme holds only
// Node, NodeList and meta/v1's options and Status, not client-go's
// kubernetes/scheme, which registers every API group at init and made
// every etcd-mode overlayd pay for kube mode (Documentation/design.md,
// "What client-go costs").
type nodeClient struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// newNodeClient returns the client of rc's API server; rc is not
// changed.
func newNodeClient(rc *rest.Config) (*nodeClient, error) {
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Node{}, &corev1.NodeList{})
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	rc = rest.CopyConfig(rc)
	rc.APIPath = "/api"
	rc.GroupVersion = &corev1.SchemeGroupVersion
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

func (c *nodeClient) get(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := c.rc.Get().Resource("nodes").Name(name).VersionedParams(&metav1.GetOptions{}, c.params).Do(ctx).Into(n)
	return n, err
}

func (c *nodeClient) list(ctx context.Context, o metav1.ListOptions) (*corev1.NodeList, error) {
	l := &corev1.NodeList{}
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
