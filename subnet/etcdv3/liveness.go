package etcdv3

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// livenessValue is the JSON of <prefix>/nodes/<node-id>.
type livenessValue struct {
	PublicIP string
	Hostname string
	Since    string
}

// livenessSlack is how long after its TTL etcd may take to revoke an
// expired lease (and so delete the liveness key it carries).
const livenessSlack = 3 * time.Second

// CheckNodeID refuses to start while another host's overlayd holds this
// node ID's liveness key. A key left by this host's own previous process
// (same public IP; a second live daemon on one host fails earlier, on its
// lock file) is not a duplicate. Another host's key may be a dead host's
// that has not expired yet: it is given its remaining TTL (plus slack) to
// vanish. The wait is bounded by that TTL, not by any per-request timeout,
// so it ends in nil, ErrDuplicateNode, ctx's error, or a request error
// (etcd unreachable: the caller may retry).
func (m *Manager) CheckNodeID(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	for {
		other, lease, rev, err := m.otherHolder(ctx, key)
		if err != nil || other == nil {
			return err
		}
		wait := m.opts.LivenessTTL + livenessSlack
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		if ttl, err := m.reg.TTL(rctx, lease); err == nil && ttl >= 0 {
			wait = time.Duration(ttl)*time.Second + livenessSlack
		}
		cancel()
		reason := fmt.Sprintf("duplicate node ID: %q is held by a live overlayd at %s (%s); waiting up to %s for its liveness key %s to expire",
			m.host.NodeID, other.PublicIP, other.Hostname, wait.Round(time.Second), key)
		m.log.Warn("another host holds this node ID's liveness key; waiting for it to expire", "other_public_ip", other.PublicIP, "wait", wait)
		if m.opts.OnWait != nil {
			m.opts.OnWait(reason)
		}
		deleted, err := m.waitDeleted(ctx, key, rev, wait)
		if err != nil {
			return err
		}
		if deleted {
			continue // gone: look again, another host may have started
		}
		// The wait is over: one last look decides.
		if other, _, _, err = m.otherHolder(ctx, key); err != nil || other == nil {
			return err
		}
		return fmt.Errorf("%w: node ID %q is held by a live overlayd at %s (%s): give every host its own --node-name (cloned machines share /etc/machine-id)",
			ErrDuplicateNode, m.host.NodeID, other.PublicIP, other.Hostname)
	}
}

// otherHolder reads the liveness key and returns its value if another host
// holds it (nil if nobody or this host does), with its etcd lease and the
// revision of the read.
func (m *Manager) otherHolder(ctx context.Context, key string) (*livenessValue, int64, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	defer cancel()
	resp, err := m.reg.cli.Get(rctx, key)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("read liveness key %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, resp.Header.Revision, nil
	}
	var v livenessValue
	if err := json.Unmarshal(resp.Kvs[0].Value, &v); err == nil && v.PublicIP == m.host.PublicIP.String() {
		return nil, 0, resp.Header.Revision, nil
	}
	return &v, resp.Kvs[0].Lease, resp.Header.Revision, nil
}

// waitDeleted watches key from after rev for up to wait and reports
// whether it was deleted. Only ctx's end is an error: a watch that breaks
// just ends the wait early, and the caller looks again.
func (m *Manager) waitDeleted(ctx context.Context, key string, rev int64, wait time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for wr := range m.reg.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return true, nil
			}
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if wctx.Err() == nil {
		// The watch broke before the wait was over: wait out the rest, so
		// a flapping watch cannot turn this into a tight loop.
		if !sleepCtx(ctx, time.Until(deadlineOf(wctx))) {
			return false, ctx.Err()
		}
	}
	return false, nil
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// keepLiveness holds <prefix>/nodes/<node-id> on a short etcd lease so tools
// can tell a live owner from a dead one. After an outage long enough for the
// short lease to expire, or if someone deletes the key, it is written again.
func (m *Manager) keepLiveness(ctx context.Context) {
	var warn repeatWarn
	for ctx.Err() == nil {
		err := m.holdLiveness(ctx)
		m.mu.Lock()
		held := !m.liveSince.IsZero()
		m.liveSince, m.liveErr = time.Time{}, err
		m.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if held {
			warn = repeatWarn{} // it was back: a new loss is news
		}
		warn.warn(m.log, "liveness key lost, re-creating", "err", err)
		if !sleepCtx(ctx, m.opts.RetryInterval) {
			return
		}
	}
}

func (m *Manager) holdLiveness(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	grant, err := m.reg.cli.Grant(ctx, int64(m.opts.LivenessTTL/time.Second))
	if err != nil {
		return fmt.Errorf("grant liveness lease: %w", err)
	}
	// Revoke on the way out so a clean stop shows "not alive" at once.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = m.reg.cli.Revoke(rctx, grant.ID)
	}()
	val, _ := json.Marshal(livenessValue{PublicIP: m.host.PublicIP.String(), Hostname: m.host.Hostname, Since: time.Now().UTC().Format(time.RFC3339)})
	put, err := m.reg.cli.Put(ctx, key, string(val), clientv3.WithLease(grant.ID))
	if err != nil {
		return fmt.Errorf("write liveness key %s: %w", key, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel below: both goroutines end with kctx
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kaCh, err := m.reg.cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		return fmt.Errorf("keep liveness lease alive: %w", err)
	}
	// Two goroutines, so that neither can delay the other: the keepalive
	// drain must notice an expired lease within its TTL however long the
	// key's watch takes to come back (without quorum, re-opening a watch
	// blocks until etcd confirms it).
	lost := make(chan error, 2)
	wg.Go(func() {
		for ka := range kaCh {
			m.reg.head.observe(ka.ResponseHeader, time.Duration(ka.TTL)*time.Second)
		}
		lost <- fmt.Errorf("liveness key %s: its %s etcd lease expired (etcd unreachable?)", key, m.opts.LivenessTTL)
	})
	wg.Go(func() {
		if err := m.watchLivenessKey(kctx, key, put.Header.Revision); err != nil {
			lost <- err
		}
	})
	m.mu.Lock()
	m.liveSince, m.liveErr = time.Now(), nil
	m.mu.Unlock()
	select {
	case err := <-lost:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchLivenessKey returns an error once the liveness key is deleted while
// its lease lives on (etcdctl del), and nil when ctx ends. A broken watch (a
// leader change, a failover) is no loss by itself — the keepalive says
// whether the session holds: it looks whether the key is still there, then
// watches again.
func (m *Manager) watchLivenessKey(ctx context.Context, key string, rev int64) error {
	for {
		wch := m.reg.cli.Watch(ownStream(clientv3.WithRequireLeader(ctx), "liveness"), key, clientv3.WithRev(rev+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return fmt.Errorf("liveness key %s was deleted", key)
				}
			}
		}
		if !sleepCtx(ctx, m.opts.RetryInterval) {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		resp, err := m.reg.cli.Get(rctx, key)
		cancel()
		if err == nil {
			if len(resp.Kvs) == 0 {
				return fmt.Errorf("liveness key %s was deleted", key)
			}
			rev = resp.Header.Revision
		}
	}
}
