package main

import (
	"fmt"
	"math"
	"strings"
)

// svg plots, against N, the join latency (p50 and p99, medians of the
// runs) and the etcd members' RSS at steady state.
func (c *coordinator) svg() string {
	type pt struct{ n, p50, p99, rss float64 }
	var pts []pt
	for _, n := range c.cfg.Ns {
		p := pt{n: float64(n)}
		for _, r := range c.results {
			if r.N != n {
				continue
			}
			switch r.Figure {
			case "join seen by all: p50":
				p.p50 = r.Median
			case "join seen by all: p99":
				p.p99 = r.Median
			case "steady etcd rss per member":
				p.rss = r.Max
			}
		}
		pts = append(pts, p)
	}
	const w, h, l, r, t, b = 560.0, 320.0, 60.0, 60.0, 30.0, 45.0
	maxN, maxMS, maxMB := 1.0, 1.0, 1.0
	for _, p := range pts {
		maxN, maxMS, maxMB = math.Max(maxN, p.n), math.Max(maxMS, p.p99), math.Max(maxMB, p.rss)
	}
	maxMS, maxMB = nice(maxMS), nice(maxMB)
	x := func(n float64) float64 { return l + (w-l-r)*n/maxN }
	y := func(v, top float64) float64 { return h - b - (h-t-b)*v/top }
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="%.0f" y="18" font-size="13">N hosts: a join seen by all (ms) and etcd member RSS (MB)</text>`+"\n", l)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", l, h-b, w-r, h-b)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", l, t, l, h-b)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", w-r, t, w-r, h-b)
	for i := 0; i <= 4; i++ {
		yy := y(maxMS*float64(i)/4, maxMS)
		fmt.Fprintf(&s, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", l, yy, w-r, yy)
		fmt.Fprintf(&s, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n", l-4, yy+4, maxMS*float64(i)/4)
		fmt.Fprintf(&s, `<text x="%.0f" y="%.1f">%g</text>`+"\n", w-r+4, yy+4, maxMB*float64(i)/4)
	}
	for _, p := range pts {
		fmt.Fprintf(&s, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0f</text>`+"\n", x(p.n), h-b+14, p.n)
	}
	fmt.Fprintf(&s, `<text x="%.0f" y="%.0f" text-anchor="middle">simulated hosts (N)</text>`+"\n", (l+w-r)/2, h-8)
	line := func(color string, v func(pt) float64, top float64, name string, k int) {
		var d []string
		for _, p := range pts {
			d = append(d, fmt.Sprintf("%.1f,%.1f", x(p.n), y(v(p), top)))
			fmt.Fprintf(&s, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.n), y(v(p), top), color)
		}
		fmt.Fprintf(&s, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(d, " "))
		fmt.Fprintf(&s, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`+"\n", l+10, t+14+14*float64(k), color, name)
	}
	line("#1f77b4", func(p pt) float64 { return p.p50 }, maxMS, "join p50 (ms, left)", 0)
	line("#d62728", func(p pt) float64 { return p.p99 }, maxMS, "join p99 (ms, left)", 1)
	line("#2ca02c", func(p pt) float64 { return p.rss }, maxMB, "etcd member RSS (MB, right)", 2)
	s.WriteString("</svg>\n")
	return s.String()
}

func nice(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
