package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// headline is one row of issue #7's table.
type headline struct {
	name, flannel, target string
	value                 string // our median [min–max], or why there is none
	met                   string // yes, NO, or "" when not measured
}

// check compares v with a limit: "<=" or ">=".
func check(v float64, op string, limit float64) string {
	if math.IsNaN(v) {
		return ""
	}
	ok := v <= limit
	if op == ">=" {
		ok = v >= limit
	}
	if ok {
		return "yes"
	}
	return "NO"
}

func span(r result) string {
	if r.N == 1 {
		return fmtFig(r.Median, r.Unit)
	}
	return fmt.Sprintf("%s [%s–%s]", fmtFig(r.Median, r.Unit), fmtFig(r.Min, r.Unit), fmtFig(r.Max, r.Unit))
}

// headlines are the table's rows: each issue's figure against flannel's
// and the target. It is long (over 80 lines) because it is that table, one
// fig call per row, in the order Documentation/benchmarks.md prints it.
func (b *bench) headlines() []headline {
	var rows []headline
	missing := func(section string) string {
		if err, ok := b.errs[section]; ok {
			return "FAILED: " + firstLine(err.Error())
		}
		return "not run"
	}
	fig := func(name, flannel, target, section, op string, limit float64, measure, metric string, params ...any) {
		h := headline{name: name, flannel: flannel, target: target}
		if r, ok := b.find(measure, metric, params...); ok {
			h.value, h.met = span(r), check(r.Median, op, limit)
		} else {
			h.value = missing(section)
		}
		rows = append(rows, h)
	}
	fig("cold start, 1000 peers in etcd → all programmed", "1.04 s", "≤ 0.12 s", "cold", "<=", 0.12, "cold_start", "wall", "k", 1000)
	fig("cold start, 5000 peers → all programmed (wall)", "5.67 s", "≤ 0.5 s", "cold", "<=", 0.5, "cold_start", "wall", "k", 5000)
	fig("cold start, 5000 peers → all programmed (CPU)", "3.1 s", "≤ 0.5 s", "cold", "<=", 0.5, "cold_start", "cpu", "k", 5000)
	// Issue #16: a dual-stack cold start within 2× of the IPv4-only one
	// at the same K (their runs alternate).
	for _, k := range b.cfg.DualKs {
		h := headline{name: fmt.Sprintf("dual-stack cold start, %d peers → both devices programmed", k), flannel: "—", target: "≤ 2× IPv4 only"}
		d, ok1 := b.find("cold_start", "wall", "k", k, "family", dualStack)
		v4, ok2 := b.find("cold_start", "wall", "k", k)
		if ok1 && ok2 {
			h.value = fmt.Sprintf("%s, %.2f× IPv4 only (%s)", span(d), d.Median/v4.Median, fmtFig(v4.Median, v4.Unit))
			h.met = check(d.Median/v4.Median, "<=", 2)
		} else {
			h.value = missing("cold")
		}
		rows = append(rows, h)
	}
	base := 0
	if len(b.cfg.EventBase) > 0 {
		base = b.cfg.EventBase[0]
	}
	fig(fmt.Sprintf("100 leases added at once while running → programmed (base %d)", base), "89 ms", "≤ 20 ms", "events", "<=", 20,
		"leases_added_100", "latency", "base", base)
	fig(fmt.Sprintf("100 leases deleted at once → entries gone (base %d)", base), "43 ms", "≤ 15 ms", "events", "<=", 15,
		"leases_deleted_100", "latency", "base", base)
	{
		h := headline{name: fmt.Sprintf("single lease event → programmed, p99 (base %d)", base), flannel: "—", target: "≤ 10 ms"}
		if r, ok := b.find("single_lease_added", "latency", "base", base); ok {
			h.value = fmt.Sprintf("p99 %s, p50 %s (n=%d)", fmtFig(r.P99, "ms"), fmtFig(r.P50, "ms"), r.N)
			h.met = check(r.P99, "<=", 10)
		} else {
			h.value = missing("events")
		}
		rows = append(rows, h)
	}
	fig("daemon peak RSS with 5000 peers", "52 MB", "≤ 30 MB", "cold", "<=", 30, "cold_start", "peak_rss", "k", 5000)
	{
		h := headline{name: "CNI ADD, sequential, median: overlay-cni's own share", flannel: "33 ms (total)", target: "≤ 2 ms over bridge"}
		o, ok1 := b.find("cni_add", "latency", "plugin", "overlay-cni", "mode", "sequential")
		br, ok2 := b.find("cni_add", "latency", "plugin", "bridge", "mode", "sequential")
		if ok1 && ok2 {
			d := o.Median - br.Median
			h.value = fmt.Sprintf("%s (%s vs bridge %s)", fmtFig(d, "ms"), fmtFig(o.Median, "ms"), fmtFig(br.Median, "ms"))
			h.met = check(d, "<=", 2)
		} else {
			h.value = missing("cni")
		}
		rows = append(rows, h)
	}
	fig("pod↔pod TCP single stream ÷ host↔host on the underlay", "0.80", "≥ 0.85", "net", ">=", 0.85, "tcp_stream", "pod_over_host")
	{
		h := headline{name: "packets lost during a daemon restart (SIGTERM, SIGKILL), 20 probes/s", flannel: "0", target: "0"}
		t, ok1 := b.find("restart", "lost_probes", "signal", "SIGTERM")
		k, ok2 := b.find("restart", "lost_probes", "signal", "SIGKILL")
		if ok1 && ok2 {
			sum := func(r result) (s float64) {
				for _, v := range r.Samples {
					s += v
				}
				return s
			}
			h.value = fmt.Sprintf("%.0f, %.0f (over %d + %d restarts)", sum(t), sum(k), t.N, k.N)
			h.met = check(sum(t)+sum(k), "<=", 0)
		} else {
			h.value = missing("restart")
		}
		rows = append(rows, h)
	}
	return rows
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func (b *bench) printTables(w io.Writer) {
	fmt.Fprintf(w, "\noverlay benchmarks — %s, %s, %d CPUs (%s), kernel %s, %s\n", b.info.Run, b.info.Host, b.info.CPUs, b.info.CPU, b.info.Kernel, b.info.Go)
	fmt.Fprintf(w, "commit %s; load average %s at start, %s at end\n", b.info.Commit, b.info.LoadStart, b.info.LoadEnd)
	if b.info.Label != "" {
		fmt.Fprintf(w, "label: %s\n", b.info.Label)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\tflanneld v0.28.9\ttarget\toverlay: median [min–max]\tmet")
	for _, h := range b.headlines() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", h.name, h.flannel, h.target, h.value, h.met)
	}
	_ = tw.Flush()

	if len(b.cfg.BinB) > 0 {
		b.printComparison(w)
	}

	fmt.Fprintln(w, "\nevery figure (median [min–max] over n runs; p50/p99 where n ≥ 20):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measure\tparameters\tmetric\tmedian\tmin\tmax\tp99\tn")
	for _, r := range b.results {
		var ps []string
		keys := make([]string, 0, len(r.Params))
		for k := range r.Params {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			ps = append(ps, fmt.Sprintf("%s=%v", k, r.Params[k]))
		}
		p99 := "-"
		if r.P99 != 0 {
			p99 = fmtFig(r.P99, r.Unit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.Measure, strings.Join(ps, " "), r.Metric,
			fmtFig(r.Median, r.Unit), fmtFig(r.Min, r.Unit), fmtFig(r.Max, r.Unit), p99, r.N)
	}
	_ = tw.Flush()
	for s, err := range b.errs {
		fmt.Fprintf(w, "\nsection %s failed: %v\n", s, err)
	}
}

// printComparison puts the binaries' cold-start figures (-bin-b) side by
// side: a is -bin's overlayd, b, c, ... -bin-b's.
func (b *bench) printComparison(w io.Writer) {
	n := 1 + len(b.cfg.BinB)
	fmt.Fprintln(w, "\ncold starts, binaries alternated run by run (medians):")
	head := "measure\tparameters\tmetric"
	for i := range n {
		fmt.Fprintf(w, "  %s = %s\n", binName(i), b.info.Binaries[binName(i)])
		head += "\t" + binName(i)
	}
	for i := 1; i < n; i++ {
		head += "\t" + binName(i) + " ÷ a"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, head)
	for _, ra := range b.results {
		if (ra.Measure != "cold_start" && ra.Measure != "cold_start_marginal") || fmt.Sprint(ra.Params["bin"]) != binA {
			continue
		}
		var query []any
		var ps []string
		keys := make([]string, 0, len(ra.Params))
		for k := range ra.Params {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "bin" {
				continue
			}
			query = append(query, k, ra.Params[k])
			ps = append(ps, fmt.Sprintf("%s=%v", k, ra.Params[k]))
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s", ra.Measure, strings.Join(ps, " "), ra.Metric, fmtFig(ra.Median, ra.Unit))
		ratios := ""
		for i := 1; i < n; i++ {
			rb, ok := b.find(ra.Measure, ra.Metric, append(slices.Clone(query), "bin", binName(i))...)
			if !ok {
				row += "\t-"
				ratios += "\t-"
				continue
			}
			row += "\t" + fmtFig(rb.Median, rb.Unit)
			ratios += fmt.Sprintf("\t%.2f", rb.Median/ra.Median)
		}
		fmt.Fprintln(tw, row+ratios)
	}
	_ = tw.Flush()
}
