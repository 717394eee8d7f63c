package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

// plotCold writes a small SVG of the cold-start figures against K: wall
// and CPU time (medians, with min–max bars) and peak RSS, so the growth
// with the number of peers can be seen at a glance.
func (b *bench) plotCold(path string) error {
	type point struct{ k, wall, wallMin, wallMax, cpu, rss float64 }
	var pts []point
	for _, k := range b.cfg.Ks {
		w, ok1 := b.find("cold_start", "wall", "k", k)
		c, ok2 := b.find("cold_start", "cpu", "k", k)
		r, ok3 := b.find("cold_start", "peak_rss", "k", k)
		if ok1 && ok2 && ok3 {
			pts = append(pts, point{float64(k), w.Median * 1000, w.Min * 1000, w.Max * 1000, c.Median * 1000, r.Median})
		}
	}
	if len(pts) < 2 {
		return nil
	}
	slices.SortFunc(pts, func(a, b point) int { return int(a.k - b.k) })
	const w, h, left, right, top, bottom = 560.0, 320.0, 60.0, 60.0, 30.0, 45.0
	maxK := pts[len(pts)-1].k
	maxMS, maxMB := 0.0, 0.0
	for _, p := range pts {
		maxMS = math.Max(maxMS, math.Max(p.wallMax, p.cpu))
		maxMB = math.Max(maxMB, p.rss)
	}
	maxMS = niceCeil(maxMS)
	maxMB = niceCeil(maxMB)
	x := func(k float64) float64 { return left + (w-left-right)*k/maxK }
	y := func(v, top2 float64) float64 { return h - bottom - (h-top-bottom)*v/top2 }

	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="%.0f" y="18" font-size="13">overlayd cold start: K leases in etcd → all programmed (%s, %d CPUs)</text>`+"\n", left, b.info.Host, b.info.CPUs)
	// Axes and grid.
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, top, left, h-bottom)
	fmt.Fprintf(&s, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", w-right, top, w-right, h-bottom)
	for i := 0; i <= 4; i++ {
		v := maxMS * float64(i) / 4
		yy := y(v, maxMS)
		fmt.Fprintf(&s, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, w-right, yy)
		fmt.Fprintf(&s, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n", left-4, yy+4, v)
		fmt.Fprintf(&s, `<text x="%.0f" y="%.1f">%g</text>`+"\n", w-right+4, yy+4, maxMB*float64(i)/4)
	}
	for _, p := range pts {
		fmt.Fprintf(&s, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0f</text>`+"\n", x(p.k), h-bottom+14, p.k)
	}
	fmt.Fprintf(&s, `<text x="%.0f" y="%.0f" text-anchor="middle">peers (K)</text>`+"\n", (left+w-right)/2, h-8)
	fmt.Fprintf(&s, `<text x="14" y="%.0f" transform="rotate(-90 14 %.0f)" text-anchor="middle">ms</text>`+"\n", (top+h-bottom)/2, (top+h-bottom)/2)
	fmt.Fprintf(&s, `<text x="%.0f" y="%.0f" transform="rotate(90 %.0f %.0f)" text-anchor="middle">peak RSS, MB</text>`+"\n", w-12, (top+h-bottom)/2, w-12, (top+h-bottom)/2)
	// Series.
	series := func(color string, v func(point) float64, top2 float64, dash string) {
		var pl []string
		for _, p := range pts {
			pl = append(pl, fmt.Sprintf("%.1f,%.1f", x(p.k), y(v(p), top2)))
		}
		fmt.Fprintf(&s, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", color, dash, strings.Join(pl, " "))
		for _, p := range pts {
			fmt.Fprintf(&s, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.k), y(v(p), top2), color)
		}
	}
	for _, p := range pts {
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#1f77b4"/>`+"\n", x(p.k), y(p.wallMin, maxMS), x(p.k), y(p.wallMax, maxMS))
	}
	series("#1f77b4", func(p point) float64 { return p.wall }, maxMS, "")
	series("#ff7f0e", func(p point) float64 { return p.cpu }, maxMS, "")
	series("#2ca02c", func(p point) float64 { return p.rss }, maxMB, "4 3")
	legend := []struct{ color, text string }{
		{"#1f77b4", "wall, median (bars: min–max)"}, {"#ff7f0e", "daemon CPU, median"}, {"#2ca02c", "peak RSS, median (right axis)"},
	}
	for i, l := range legend {
		yy := top + 8 + float64(i)*15
		fmt.Fprintf(&s, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", left+10, yy-8, l.color, left+24, yy+1, l.text)
	}
	s.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(s.String()), 0o644)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
