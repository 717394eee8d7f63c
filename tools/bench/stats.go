package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// summary condenses repeated measurements of one figure.
type summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	P50    float64 `json:"p50,omitempty"`
	P90    float64 `json:"p90,omitempty"`
	P99    float64 `json:"p99,omitempty"`
}

// summarize returns median, min and max of xs (and percentiles if
// withPercentiles). The median of an even count is the mean of the middle two.
func summarize(xs []float64, withPercentiles bool) summary {
	if len(xs) == 0 {
		return summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	out := summary{N: len(s), Min: s[0], Max: s[len(s)-1]}
	if len(s)%2 == 1 {
		out.Median = s[len(s)/2]
	} else {
		out.Median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if withPercentiles {
		out.P50, out.P90, out.P99 = percentile(s, 50), percentile(s, 90), percentile(s, 99)
	}
	return out
}

// percentile of sorted s by the nearest-rank method: the smallest value
// with at least p% of the samples at or below it.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func secs(d time.Duration) float64 { return d.Seconds() }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fmtFig formats a figure in its unit with a sensible precision.
func fmtFig(v float64, unit string) string {
	if math.IsNaN(v) {
		return "-"
	}
	switch unit {
	case "s":
		if v < 1 {
			return fmt.Sprintf("%.0f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "ms":
		if v < 10 {
			return fmt.Sprintf("%.2f ms", v)
		}
		return fmt.Sprintf("%.1f ms", v)
	case "MB":
		return fmt.Sprintf("%.1f MB", v)
	case "ratio":
		return fmt.Sprintf("%.2f", v)
	case "Gbit/s":
		return fmt.Sprintf("%.2f Gbit/s", v)
	case "peers/s":
		return fmt.Sprintf("%.0f/s", v)
	case "µs":
		return fmt.Sprintf("%.1f µs", v)
	case "B":
		return fmt.Sprintf("%.0f B", v)
	case "probes":
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}
