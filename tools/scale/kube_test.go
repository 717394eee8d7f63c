package main

import (
	"maps"
	"testing"
)

// Two scrapes of a kube-apiserver's /metrics (v1.37's label sets, trimmed):
// the figures count only what concerns Nodes and only what grew.
const (
	scrape0 = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 5000
apiserver_watch_events_total{group="",resource="pods",version="v1"} 10
`
	scrape1 = `apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 10
apiserver_request_total{code="429",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 9
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 4
apiserver_watch_events_total{group="",resource="nodes",version="v1"} 5600
apiserver_watch_events_total{group="",resource="pods",version="v1"} 70
`
)

func TestDeltaCountsOnlyWhatConcernsNodes(t *testing.T) {
	names := []string{"apiserver_request_total", "apiserver_watch_events_total"}
	a, b := parseCounters(scrape0, names...), parseCounters(scrape1, names...)
	byVerb := func(l map[string]string) string { return l["verb"] + " " + l["subresource"] + " " + l["code"] }
	total, parts := delta(a, b, names[0], nodesResource, byVerb)
	// PATCH status grew by 3; the WATCH series is new (2); LIST did not
	// grow; pods and another group's "nodes" are not the core Nodes.
	if want := map[string]float64{"PATCH status 200": 3, "WATCH  429": 2}; total != 5 || !maps.Equal(parts, want) {
		t.Errorf("requests: %v %v, want 5 %v", total, parts, want)
	}
	if ev, _ := delta(a, b, names[1], nodesResource, byVerb); ev != 600 {
		t.Errorf("watch events: %v, want 600", ev)
	}
}

func TestWatchEventsByKindCountToo(t *testing.T) {
	// Older API servers name the kind, not the resource.
	a := parseCounters(`apiserver_watch_events_total{group="",kind="Node",version="v1"} 1`, "apiserver_watch_events_total")
	b := parseCounters(`apiserver_watch_events_total{group="",kind="Node",version="v1"} 4`, "apiserver_watch_events_total")
	if ev, _ := delta(a, b, "apiserver_watch_events_total", nodesResource, func(map[string]string) string { return "" }); ev != 3 {
		t.Errorf("watch events: %v, want 3", ev)
	}
}
