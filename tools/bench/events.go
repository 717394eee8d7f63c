package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// commitClock tells when each etcd revision under the subnets prefix
// became visible to watchers: a watch of this process is served by the
// same watch loop of the same server as the daemon's, so it sees the
// revision at about the moment the daemon does — as close to the commit as
// a client can observe. (The write's own response may come back after the
// daemon has already acted on the event.)
type commitClock struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	seen   map[int64]time.Time
	cond   *sync.Cond
}

func newCommitClock(ctx context.Context, cli *clientv3.Client) *commitClock {
	ctx, cancel := context.WithCancel(ctx)
	c := &commitClock{cancel: cancel, seen: map[int64]time.Time{}}
	c.cond = sync.NewCond(&c.mu)
	wch := cli.Watch(ctx, etcdv3.DefaultPrefix+"/subnets/", clientv3.WithPrefix())
	go func() {
		for resp := range wch {
			now := time.Now()
			c.mu.Lock()
			for _, ev := range resp.Events {
				if _, ok := c.seen[ev.Kv.ModRevision]; !ok {
					c.seen[ev.Kv.ModRevision] = now
				}
			}
			c.cond.Broadcast()
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.seen[-1] = time.Now() // closed
		c.cond.Broadcast()
		c.mu.Unlock()
	}()
	return c
}

// at waits (up to 5 s) for revision rev and returns when it was seen.
func (c *commitClock) at(rev int64) (time.Time, error) {
	deadline := time.Now().Add(5 * time.Second)
	t := time.AfterFunc(5*time.Second, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer t.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if at, ok := c.seen[rev]; ok {
			delete(c.seen, rev)
			return at, nil
		}
		if _, closed := c.seen[-1]; closed || time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("revision %d never seen by the watch", rev)
		}
		c.cond.Wait()
	}
}

// committed estimates when revision rev was committed: the earlier of the
// moment this process's watch saw it and the moment the write's response
// (acked) came back. The commit precedes both; whichever of the two
// goroutines ran first on a busy machine is the closer bound.
func (c *commitClock) committed(rev int64, acked time.Time) (time.Time, error) {
	seen, err := c.at(rev)
	if err != nil {
		return time.Time{}, err
	}
	if acked.Before(seen) {
		return acked, nil
	}
	return seen, nil
}

func (c *commitClock) close() { c.cancel() }

// eventTimeout bounds the wait for one event's kernel entries.
const eventTimeout = 10 * time.Second

// eventGap separates single events so that each is a pass of its own.
const eventGap = 20 * time.Millisecond

// benchEvents measures a running daemon's reaction to lease changes, for
// every base peer count.
func (b *bench) benchEvents(ctx context.Context) error {
	for i, base := range b.cfg.EventBase {
		if err := b.eventsAt(ctx, base, i+1); err != nil {
			return fmt.Errorf("base %d: %w", base, err)
		}
	}
	return nil
}

// eventsAt measures one base peer count: batches of 100 leases added and
// deleted in one transaction, then single events, then the daemon's CPU
// over them. It is long (over 80 lines) as a script is: each measurement
// follows the last on the same daemon, clock and watch, in the order
// Documentation/benchmarks.md describes.
func (b *bench) eventsAt(ctx context.Context, base, hostNum int) error {
	sh, err := b.seedHost(ctx, fmt.Sprintf("ev%d", hostNum), "w1", base, ipv4Only)
	if err != nil {
		return err
	}
	defer sh.Close()
	cli, n, w, basePeers := sh.cli, sh.node, sh.watch, sh.peers
	ready := w.expect(basePeers, true)
	if err := n.Start(); err != nil {
		return err
	}
	if _, err := w.wait(ready, b.cfg.ColdTimeout); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.WaitReady(rctx); err != nil {
		return err
	}
	p := map[string]any{"base": base}
	clock := newCommitClock(ctx, cli)
	defer clock.close()

	// 100 leases in one etcd transaction (one watch response), then gone
	// in another.
	var adds, dels, writes, addsSent, delsSent []float64
	batch := synthPeers(base+1, base+101)
	for round := range b.cfg.Batches {
		for _, add := range []bool{true, false} {
			done := w.expect(batch, add)
			sent := time.Now()
			var rev int64
			var err error
			if add {
				rev, err = putLeases(ctx, cli, batch)
			} else {
				rev, err = deleteLeases(ctx, cli, batch)
			}
			if err != nil {
				return err
			}
			acked := time.Now()
			at, err := w.wait(done, eventTimeout)
			if err != nil {
				return fmt.Errorf("100 leases %s, round %d: %w (overlayd log: %s)", map[bool]string{true: "added", false: "deleted"}[add], round+1, err, n.LogFile)
			}
			committed, err := clock.committed(rev, acked)
			if err != nil {
				return err
			}
			writes = append(writes, ms(acked.Sub(sent)))
			if add {
				adds = append(adds, ms(at.Sub(committed)))
				addsSent = append(addsSent, ms(at.Sub(sent)))
			} else {
				dels = append(dels, ms(at.Sub(committed)))
				delsSent = append(delsSent, ms(at.Sub(sent)))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	b.logf("base %d: 100 added %v ms, 100 deleted %v ms", base, round1(adds), round1(dels))
	b.add(result{Measure: "leases_added_100", Metric: "latency", Unit: "ms", Params: p}, adds)
	b.add(result{Measure: "leases_deleted_100", Metric: "latency", Unit: "ms", Params: p}, dels)
	b.add(result{Measure: "leases_added_100", Metric: "latency_from_write_request", Unit: "ms", Params: p}, addsSent)
	b.add(result{Measure: "leases_deleted_100", Metric: "latency_from_write_request", Unit: "ms", Params: p}, delsSent)

	// Single events: a lease written, programmed, deleted, gone.
	cpu0, err := procCPU(n.PID())
	if err != nil {
		return err
	}
	var sadd, sdel, saddSent, sdelSent []float64
	for i := range b.cfg.Events {
		peer := synthPeers(base+201+i, base+202+i)
		for _, add := range []bool{true, false} {
			done := w.expect(peer, add)
			sent := time.Now()
			var rev int64
			if add {
				resp, err := cli.Put(ctx, leaseKey(peer[0].Subnet), leaseValue(peer[0]))
				if err != nil {
					return err
				}
				rev = resp.Header.Revision
			} else {
				resp, err := cli.Delete(ctx, leaseKey(peer[0].Subnet))
				if err != nil {
					return err
				}
				rev = resp.Header.Revision
			}
			acked := time.Now()
			at, err := w.wait(done, eventTimeout)
			if err != nil {
				return fmt.Errorf("single event %d: %w (overlayd log: %s)", i+1, err, n.LogFile)
			}
			committed, err := clock.committed(rev, acked)
			if err != nil {
				return err
			}
			writes = append(writes, ms(acked.Sub(sent)))
			if add {
				sadd = append(sadd, ms(at.Sub(committed)))
				saddSent = append(saddSent, ms(at.Sub(sent)))
			} else {
				sdel = append(sdel, ms(at.Sub(committed)))
				sdelSent = append(sdelSent, ms(at.Sub(sent)))
			}
			time.Sleep(eventGap)
		}
	}
	cpu1, err := procCPU(n.PID())
	if err != nil {
		return err
	}
	b.add(result{Measure: "single_lease_added", Metric: "latency", Unit: "ms", Params: p}, sadd)
	b.add(result{Measure: "single_lease_deleted", Metric: "latency", Unit: "ms", Params: p}, sdel)
	b.add(result{Measure: "single_lease_added", Metric: "latency_from_write_request", Unit: "ms", Params: p}, saddSent)
	b.add(result{Measure: "single_lease_deleted", Metric: "latency_from_write_request", Unit: "ms", Params: p}, sdelSent)
	b.add(result{Measure: "single_lease_event", Metric: "daemon_cpu_per_event", Unit: "ms", Params: p},
		[]float64{ms(cpu1-cpu0) / float64(2*b.cfg.Events)})
	b.add(result{Measure: "etcd_write", Metric: "request_to_response", Unit: "ms", Params: p}, writes)
	s := summarize(sadd, true)
	b.logf("base %d: single add p50 %.2f ms p99 %.2f ms; daemon CPU %.2f ms per event", base, s.P50, s.P99, ms(cpu1-cpu0)/float64(2*b.cfg.Events))
	return nil
}

func round1(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int(x*10+0.5)) / 10
	}
	return out
}
