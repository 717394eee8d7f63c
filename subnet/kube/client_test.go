package kube

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// A Node as an API server writes it, with fields the source does not read.
const nodeJSON = `{"kind":"Node","apiVersion":"v1",
 "metadata":{"name":"n1","uid":"u-1","resourceVersion":"42","labels":{"a":"b"},
  "annotations":{"flannel.alpha.coreos.com/public-ip":"198.19.0.1","other":"x"},
  "managedFields":[{"manager":"kubelet","operation":"Update"}]},
 "spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00:1::/64"],"taints":[{"key":"k","effect":"NoSchedule"}]},
 "status":{"conditions":[{"type":"Ready","status":"True"},
  {"type":"NetworkUnavailable","status":"False","reason":"OverlayIsUp","lastTransitionTime":"2026-11-27T10:00:00Z"}],
  "addresses":[{"type":"InternalIP","address":"198.18.0.1"}],"images":[{"names":["busybox"],"sizeBytes":1}]}}`

func testScheme(t *testing.T) (runtime.Decoder, runtime.ParameterCodec) {
	t.Helper()
	c, err := newNodeClient(&rest.Config{Host: "https://127.0.0.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	return serializer.NewCodecFactory(nodeScheme()).UniversalDeserializer(), c.params
}

// TestNodeDecodes: the API server's JSON of a Node and of a NodeList
// decode into the source's own types with every field it reads.
func TestNodeDecodes(t *testing.T) {
	dec, _ := testScheme(t)
	obj, _, err := dec.Decode([]byte(nodeJSON), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := obj.(*node)
	if !ok {
		t.Fatalf("decoded a %T, want *node", obj)
	}
	if n.Name != "n1" || n.ResourceVersion != "42" || n.UID != "u-1" {
		t.Errorf("metadata = %q %q %q", n.Name, n.ResourceVersion, n.UID)
	}
	if n.Annotations["flannel.alpha.coreos.com/public-ip"] != "198.19.0.1" {
		t.Errorf("annotations = %v", n.Annotations)
	}
	if n.Spec.PodCIDR != "10.244.1.0/24" || strings.Join(n.Spec.PodCIDRs, ",") != "10.244.1.0/24,fd00:1::/64" {
		t.Errorf("spec = %+v", n.Spec)
	}
	if !networkAvailable(n) {
		t.Errorf("NetworkUnavailable=False not read: %+v", n.Status.Conditions)
	}
	s := slim(n, "flannel.alpha.coreos.com/").(*node)
	if len(s.Annotations) != 1 || len(s.ManagedFields) != 0 || len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Reason != "OverlayIsUp" {
		t.Errorf("slim kept %+v", s)
	}

	list := `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"43"},"items":[` + nodeJSON + `]}`
	obj, _, err = dec.Decode([]byte(list), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, ok := obj.(*nodeList)
	if !ok || l.ResourceVersion != "43" || len(l.Items) != 1 || l.Items[0].Spec.PodCIDR != "10.244.1.0/24" {
		t.Fatalf("list = %#v", obj)
	}
	cp := l.DeepCopyObject().(*nodeList)
	cp.Items[0].Annotations["other"] = "changed"
	cp.Items[0].Spec.PodCIDRs[0] = "changed"
	cp.Items[0].Status.Conditions[0].Status = "changed"
	if n := l.Items[0]; n.Annotations["other"] != "x" || n.Spec.PodCIDRs[0] != "10.244.1.0/24" || n.Status.Conditions[0].Status != "True" {
		t.Errorf("the deep copy shares memory with its original: %+v", n)
	}

	if _, _, err := dec.Decode([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}`), nil, nil); err == nil || !strings.Contains(err.Error(), "Pod") {
		t.Errorf("a Pod decoded: %v", err)
	}
}

// TestListOptionsReachTheQuery: what the informer's reflector asks (a
// watch from a resourceVersion, with bookmarks and initial events) is
// in the request's query, as client-go's typed client sends it.
func TestListOptionsReachTheQuery(t *testing.T) {
	_, params := testScheme(t)
	yes, timeout := true, int64(300)
	q, err := params.EncodeParameters(&metav1.ListOptions{ResourceVersion: "7", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		Watch: true, AllowWatchBookmarks: true, SendInitialEvents: &yes, TimeoutSeconds: &timeout, Limit: 500}, coreV1)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"resourceVersion": "7", "resourceVersionMatch": "NotOlderThan", "watch": "true",
		"allowWatchBookmarks": "true", "sendInitialEvents": "true", "timeoutSeconds": "300", "limit": "500"} {
		if got := q.Get(k); got != v {
			t.Errorf("query %s = %q, want %q (all: %v)", k, got, v, q)
		}
	}
}
