package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// scenarios runs each scenario named by -scenarios and measures how long
// until every host is current again, what etcd spent meanwhile, and what
// the hosts re-listed and logged.
func (m *atN) scenarios() error {
	for _, sc := range strings.Split(m.c.cfg.Scenarios, ",") {
		if err := m.scenario(sc); err != nil {
			return fmt.Errorf("%s: %w", sc, err)
		}
	}
	return nil
}

func (m *atN) scenario(sc string) error {
	before, err := stats(m.ws)
	if err != nil {
		return err
	}
	cpuA, _ := m.cl.usage()
	tA := time.Now()
	from := tA // when the hosts may begin to catch up
	switch sc {
	case "churn":
		// 1 % of hosts restart within a minute.
		if _, err := all[map[string]any](m.ws, "restart 0.01 60"); err != nil {
			return err
		}
	case "restart":
		rs, err := all[map[string]any](m.ws, "restart 1 10")
		if err != nil {
			return err
		}
		fmt.Printf("   restart: %v\n", rs)
	case "leader":
		l := m.cl.leader(m.admin)
		if l < 0 {
			return errors.New("no leader found")
		}
		m.cl.stop(l)
	case "partition", "compact":
		// The proxied hosts are cut off; a host joins meanwhile (its
		// lease stays). compact: after 20 s, etcd compacts past every
		// revision the cut-off hosts have seen, so none can resume.
		if m.c.cfg.Proxied == 0 {
			return nil
		}
		if err := m.isolated(sc == "compact"); err != nil {
			return err
		}
		from = time.Now()
	default:
		return errors.New("unknown scenario")
	}
	lat, missing, err := m.untilCurrent(sc, from)
	if err != nil {
		return err
	}
	current := time.Since(from).Seconds() - (time.Since(m.c.lastWrite).Seconds() - pct(lat, 1)/1000)
	cpuB, rssB := m.cl.usage()
	for i := range m.cl.procs {
		if m.cl.procs[i] == nil {
			if err := m.cl.start(i, "existing"); err != nil {
				return err
			}
		}
	}
	after, err := stats(m.ws)
	if err != nil {
		return err
	}
	printWarnings(sc, before.kinds, after.kinds)
	note := fmt.Sprintf("missing=%d relists=%d max_per_host=%d periodic_relists=%d refusals=%d", missing, after.relists-before.relists,
		after.relistsMax, after.periodic-before.periodic, after.refusals-before.refusals)
	m.add(sc+": all current after", "s", []float64{current}, note)
	m.add(sc+": etcd cpu (3 members)", "cores", []float64{cpuSince(cpuA, cpuB, time.Since(tA).Seconds())}, "")
	m.add(sc+": etcd rss per member", "MB", mb(rssB), "")
	return nil
}

// untilCurrent writes joins until one is seen by every host (within 30 s
// each), for up to 5 minutes after from, and returns the last one's
// latencies and how many hosts missed it.
func (m *atN) untilCurrent(sc string, from time.Time) ([]float64, int, error) {
	for {
		m.probe++
		lat, missing, err := m.join(m.probe)
		if err != nil || missing == 0 || time.Since(from) > 5*time.Minute {
			return lat, missing, err
		}
		fmt.Printf("   %s: %d hosts not current after %s\n", sc, missing, time.Since(from).Round(time.Second))
	}
}

// writeProbe writes the lease of a joining host, the k-th probe (or a
// later one where a simulated host holds that subnet), retrying until etcd
// commits it, and returns its subnet and when the write that succeeded began.
func (m *atN) writeProbe(k int) (netip.Prefix, time.Time, error) {
	if m.kapi != nil {
		return m.kapi.writeProbe(k)
	}
	attrs := probeAttrs(k)
	// Bounded: a cluster that does not commit within a minute is a result.
	for give := time.Now().Add(time.Minute); time.Now().Before(give); {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + k/10000), byte(k % 256), 0}), 24)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		m.c.lastWrite = t0
		_, err := m.reg.Create(ctx, subnet.Subnets{IPv4: p}, attrs, 0)
		cancel()
		switch {
		case err == nil:
			return p, t0, nil
		case errors.Is(err, etcdv3.ErrTaken):
			k += 256 // a host picked it at random: take the next one
		default:
			time.Sleep(500 * time.Millisecond)
		}
	}
	return netip.Prefix{}, time.Time{}, errors.New("write a joining host's lease: etcd did not commit it within a minute")
}

// probeAttrs is the lease value of the k-th joining host.
func probeAttrs(k int) subnet.LeaseAttrs {
	return subnet.NewAttrs(netip.MustParseAddr("192.0.2.1"), subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{2, 0, 0, 0, 0, 1}), probeName(k), "probe")
}

// probeName is the k-th joining host's node ID or Node name.
func probeName(k int) string { return fmt.Sprintf("probe-%d", k) }

// isolated cuts the proxied hosts off, writes the lease of a joining host
// (seen only by the others), compacts etcd's history to the present when
// compact is set, and heals.
func (m *atN) isolated(compact bool) error {
	if _, err := all[map[string]any](m.ws, "partition"); err != nil {
		return err
	}
	hold := m.c.cfg.Partition
	if compact {
		hold = 20 * time.Second
	}
	end := time.Now().Add(hold)
	m.probe++
	if _, _, err := m.writeProbe(m.probe); err != nil {
		return fmt.Errorf("a join during the partition: %w", err)
	}
	time.Sleep(time.Until(end))
	if compact {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := m.admin.Get(ctx, "compaction-probe")
		if err != nil {
			return err
		}
		if _, err := m.admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			return fmt.Errorf("compact: %w", err)
		}
	}
	_, err := all[map[string]any](m.ws, "heal")
	return err
}

// join writes a new host's lease and returns how long after the write each
// host saw it (ms) and how many hosts did not within 30 s.
func (m *atN) join(k int) ([]float64, int, error) {
	p, t0, err := m.writeProbe(k)
	if err != nil {
		return nil, 0, err
	}
	rs, err := all[seenReply](m.ws, "seen "+p.String()+" 30")
	var lat []float64
	missing := 0
	for _, r := range rs {
		missing += r.Missing
		for _, t := range r.Seen {
			lat = append(lat, float64(t-t0.UnixNano())/1e6)
		}
	}
	// The probe is removed again so the next one starts from the same set.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m.kapi != nil {
		m.kapi.removeProbe(ctx, p)
	} else {
		_, _ = m.reg.Delete(ctx, subnet.Subnets{IPv4: p})
	}
	return lat, missing, err
}

// printWarnings lists the kinds of warning the hosts logged between two
// stats, most frequent first.
func printWarnings(what string, before, after map[string]int) {
	type kind struct {
		text string
		n    int
	}
	var ks []kind
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			ks = append(ks, kind{k, d})
		}
	}
	slices.SortFunc(ks, func(a, b kind) int { return b.n - a.n })
	for _, k := range ks[:min(len(ks), 8)] {
		fmt.Printf("   %s: %6d × %s\n", what, k.n, k.text)
	}
}
