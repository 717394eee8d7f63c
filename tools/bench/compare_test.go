package main

import (
	"bytes"
	"strings"
	"testing"
)

// With -bin-b, the cold starts rotate through the binaries run by run, the
// headline figures are -bin's (bin=a), a query names another binary to get
// its figures, and the side-by-side table shows each against a.
func TestComparingBinaries(t *testing.T) {
	cfg, err := parseFlags([]string{"-bin-b", "/x/b, /x/c", "-only", "cold", "-k", "1000,10000"})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{cfg: cfg, info: runInfo{Binaries: map[string]string{"a": "A", "b": "B", "c": "C"}}}
	bins := b.coldBinaries()
	if len(bins) != 3 || bins[0].name != "a" || bins[0].overlayd != "" || bins[2].name != "c" || bins[2].overlayd != "/x/c/overlayd" {
		t.Fatalf("binaries: %+v", bins)
	}
	for i, bin := range bins {
		var c coldSeries
		c.cpus = []float64{[]float64{0.1, 0.2, 0.3}[i]}
		c.rss = []float64{30}
		b.addCold(1000, ipv4Only, bin.name, c)
	}
	if r, ok := b.find("cold_start", "cpu", "k", 1000); !ok || r.Median != 0.1 {
		t.Errorf("headline figure: %v %v, want a's 0.1", r.Median, ok)
	}
	if r, ok := b.find("cold_start", "cpu", "k", 1000, "bin", "c"); !ok || r.Median != 0.3 {
		t.Errorf("c's figure: %v %v, want 0.3", r.Median, ok)
	}
	if r, ok := b.find("cold_start", "cpu_per_peer", "k", 1000, "bin", "b"); !ok || r.Median < 199.9 || r.Median > 200.1 {
		t.Errorf("b's CPU per peer: %v µs %v, want 200", r.Median, ok)
	}
	var out bytes.Buffer
	b.printComparison(&out)
	if !strings.Contains(out.String(), "  c = C") || !strings.Contains(out.String(), "3.00") {
		t.Errorf("comparison table:\n%s", out.String())
	}
}
