package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want summary
	}{
		{"odd count", []float64{3, 1, 2}, summary{N: 3, Median: 2, Min: 1, Max: 3, P50: 2, P90: 3, P99: 3}},
		{"even count", []float64{4, 1, 3, 2}, summary{N: 4, Median: 2.5, Min: 1, Max: 4, P50: 2, P90: 4, P99: 4}},
		{"one sample", []float64{7}, summary{N: 1, Median: 7, Min: 7, Max: 7, P50: 7, P90: 7, P99: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, summarize(tc.in, true)); d != "" {
				t.Errorf("summarize(%v) (-want +got):\n%s", tc.in, d)
			}
		})
	}
}

func TestPercentileNearestRank(t *testing.T) {
	s := make([]float64, 200)
	for i := range s {
		s[i] = float64(i + 1)
	}
	// p99 of 1..200 is the 198th value: two samples above it.
	if got := percentile(s, 99); got != 198 {
		t.Errorf("p99 of 1..200 = %v, want 198", got)
	}
	if got := percentile(s, 50); got != 100 {
		t.Errorf("p50 of 1..200 = %v, want 100", got)
	}
}
