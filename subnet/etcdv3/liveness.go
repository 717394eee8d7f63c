package etcdv3

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// livenessValue is the JSON of <prefix>/nodes/<node-id>. An address the
// host does not have is "" (an IPv6-only host has no PublicIP).
type livenessValue struct {
	PublicIP   string
	PublicIPv6 string `json:",omitempty"`
	Hostname   string
	Since      string
}

// livenessOf is the value this host writes.
func livenessOf(h subnet.Host) livenessValue {
	return livenessValue{PublicIP: addrOrEmpty(h.PublicIP), PublicIPv6: addrOrEmpty(h.PublicIPv6), Hostname: h.Hostname,
		Since: time.Now().UTC().Format(time.RFC3339)}
}

func addrOrEmpty(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// writtenBy reports whether v was written from one of h's public
// addresses: by an earlier process of this host.
func (v livenessValue) writtenBy(h subnet.Host) bool {
	return h.PublicIP.IsValid() && v.PublicIP == h.PublicIP.String() ||
		h.PublicIPv6.IsValid() && v.PublicIPv6 == h.PublicIPv6.String()
}

// String names the holder for messages, "198.18.0.1 (h1)" (an IPv6-only
// host by its IPv6 address). The value is anyone's to write: what is not
// an address or a plain host name is quoted.
func (v livenessValue) String() string {
	ip := v.PublicIP
	if ip == "" {
		ip = v.PublicIPv6
	}
	return subnet.ShownAddr(ip) + " (" + subnet.ShownName(v.Hostname) + ")"
}

// livenessSlack is how long after its TTL etcd may take to revoke an
// expired lease (and so delete the liveness key it carries).
const livenessSlack = 3 * time.Second

// nodeClaim holds this host's node ID: the liveness key
// <prefix>/nodes/<node-id> on a short etcd lease, claimed before any lease
// is looked at (claim) and kept while the daemon runs (keep), so that a
// clone of this host cannot take its lease and tools can tell a live owner
// from a dead one.
type nodeClaim struct {
	*lessee
	mu        sync.Mutex
	held      *liveClaim // the liveness key claim wrote, until keep takes it over
	liveSince time.Time  // zero while the liveness key is not held
	liveErr   error      // why the liveness key is not held, once it was lost
}

// liveness reports whether the liveness key is held and, if not, why.
func (m *nodeClaim) liveness() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.liveSince.IsZero(), m.liveErr
}

// claim makes this process the holder of the node ID: it writes the
// liveness key on a short etcd lease, atomically, unless another host's
// overlayd holds it. The key is kept alive from here on (Run takes it
// over), so a clone that starts while this host is still starting up is
// refused too: a check that only read the key would let both through until
// the first one's Run wrote it.
//
// A key left by this host's own previous process (written from one of its
// public addresses; a second live daemon on one host fails earlier, on its
// lock file) is taken over.
// Another host's key may be a dead host's that has not expired yet: it is
// given its remaining TTL (plus slack) to vanish. The wait is bounded by
// that TTL, not by any per-request timeout, so it ends in nil,
// ErrDuplicateNode, ctx's error, or a request error (etcd unreachable: the
// caller may retry).
//
// A caller that gives up before Run (a later start-up step failed) calls
// release, so that the node ID is free at once, not after the TTL.
func (m *nodeClaim) claim(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	waited := false
	for {
		c, other, err := m.claimLiveness(ctx)
		if err != nil {
			return err
		}
		if other == nil {
			m.setClaim(c)
			return nil
		}
		if waited {
			return fmt.Errorf("%w: node ID %q is held by a live overlayd at %s: give every host its own --node-name (cloned machines share /etc/machine-id)",
				ErrDuplicateNode, m.host.NodeID, other)
		}
		wait := m.opts.LivenessTTL + livenessSlack
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		if ttl, err := m.reg.TTL(rctx, other.lease); err == nil && ttl >= 0 {
			wait = time.Duration(ttl)*time.Second + livenessSlack
		}
		cancel()
		reason := fmt.Sprintf("duplicate node ID: %q is held by a live overlayd at %s; waiting up to %s for its liveness key %s to expire",
			m.host.NodeID, other, wait.Round(time.Second), key)
		m.log.Warn("another host holds this node ID's liveness key; waiting for it to expire", "other", other.String(), "wait", wait)
		if m.opts.OnWait != nil {
			m.opts.OnWait(reason)
		}
		deleted, err := m.waitDeleted(ctx, key, other.rev, wait)
		if err != nil {
			return err
		}
		// Deleted: claim again (another host may have been faster). Not
		// deleted within its TTL: one last attempt decides.
		waited = !deleted
	}
}

// liveClaim is a liveness key this process wrote: the etcd lease that
// carries it, kept alive from the claim on.
type liveClaim struct {
	lease clientv3.LeaseID
	rev   int64 // the revision of the write
	ka    <-chan *clientv3.LeaseKeepAliveResponse
	stop  context.CancelFunc // ends the keepalive
}

// release stops the keepalive and revokes the lease, so a clean stop shows
// "not alive" at once.
func (c *liveClaim) release(ctx context.Context, cli *clientv3.Client) {
	c.stop()
	revoke(ctx, cli, c.lease)
}

// revoke revokes an etcd lease, within 2 s, also once ctx has ended.
func revoke(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = cli.Revoke(rctx, id)
}

// liveHolder is another host's liveness key: its value, its etcd lease and
// the revision it was read at.
type liveHolder struct {
	livenessValue
	lease int64
	rev   int64
}

// maxClaimAttempts bounds the compare-and-put loop of claimLiveness: only
// this host's own previous key, changing under it, makes it go round.
const maxClaimAttempts = 3

// claimLiveness writes the liveness key on a new etcd lease if the key is
// absent or was written by this host (a previous process), in one
// transaction each: two hosts claiming at once cannot both succeed. If
// another host holds the key it returns that holder and writes nothing.
func (m *nodeClaim) claimLiveness(ctx context.Context) (*liveClaim, *liveHolder, error) {
	key := m.reg.NodeKey(m.host.NodeID)
	cli := m.reg.cli
	// Each request is bounded: with etcd out of reach the caller gets an
	// error to retry on, not a start-up that hangs.
	rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	defer cancel()
	grant, err := cli.Grant(rctx, int64(m.opts.LivenessTTL/time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("grant liveness lease: %w", err)
	}
	won := false
	defer func() {
		if !won {
			revoke(ctx, cli, grant.ID)
		}
	}()
	val, _ := json.Marshal(livenessOf(m.host))
	var mod int64 // the ModRevision the key must have: 0 is absent
	for range maxClaimAttempts {
		resp, err := cli.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(grant.ID))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return nil, nil, fmt.Errorf("write liveness key %s: %w", key, err)
		}
		if resp.Succeeded {
			if m.reg.head.wrote(resp.Header) {
				m.log.Warn("etcd's store was re-created (wiped or restored from a backup): its revision went back or its cluster ID changed; re-claiming the lease and re-listing every lease",
					"revision", resp.Header.Revision, "cluster", fmt.Sprintf("%x", resp.Header.ClusterId))
			}
			// The keepalive outlives this call's ctx, which may be one
			// attempt's: release ends it.
			kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
			ka, err := cli.KeepAlive(kctx, grant.ID)
			if err != nil {
				stop()
				return nil, nil, fmt.Errorf("keep liveness lease alive: %w", err)
			}
			won = true
			return &liveClaim{lease: grant.ID, rev: resp.Header.Revision, ka: ka, stop: stop}, nil, nil
		}
		var kvs []*mvccpb.KeyValue // the Else branch's read
		if len(resp.Responses) > 0 {
			kvs = resp.Responses[0].GetResponseRange().GetKvs()
		}
		if len(kvs) == 0 {
			mod = 0 // deleted since the compare
			continue
		}
		var v livenessValue
		if err := json.Unmarshal(kvs[0].Value, &v); err == nil && v.writtenBy(m.host) {
			mod = kvs[0].ModRevision // this host's previous process: take it over
			continue
		}
		return nil, &liveHolder{livenessValue: v, lease: kvs[0].Lease, rev: resp.Header.Revision}, nil
	}
	return nil, nil, fmt.Errorf("write liveness key %s: it changed under each of %d attempts", key, maxClaimAttempts)
}

// setClaim keeps c for Run, releasing a claim not taken yet.
func (m *nodeClaim) setClaim(c *liveClaim) {
	m.mu.Lock()
	old := m.held
	m.held = c
	m.mu.Unlock()
	if old != nil {
		old.release(context.Background(), m.reg.cli)
	}
}

// release gives up the claim if keep has not taken it over.
func (m *nodeClaim) release(ctx context.Context) {
	if c := m.takeClaim(); c != nil {
		c.release(ctx, m.reg.cli)
	}
}

// takeClaim returns the claim claim made, once; nil after that.
func (m *nodeClaim) takeClaim() *liveClaim {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.held
	m.held = nil
	return c
}

// waitDeleted watches key from after rev for up to wait and reports
// whether it was deleted. Only ctx's end is an error: a watch that breaks
// just ends the wait early, and the caller looks again.
func (m *nodeClaim) waitDeleted(ctx context.Context, key string, rev int64, wait time.Duration) (bool, error) {
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
func (m *nodeClaim) keep(ctx context.Context) {
	var warn repeatWarn
	for ctx.Err() == nil {
		err := m.hold(ctx)
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

func (m *nodeClaim) hold(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	c := m.takeClaim()
	if c == nil {
		// Re-created after a loss: still only if nobody else holds it.
		var other *liveHolder
		var err error
		if c, other, err = m.claimLiveness(ctx); err != nil {
			return err
		}
		if other != nil {
			return fmt.Errorf("liveness key %s is held by another overlayd at %s: give every host its own --node-name", key, other)
		}
	}
	defer c.release(ctx, m.reg.cli) // last, once both goroutines are done
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel below: both goroutines end with kctx
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Two goroutines, so that neither can delay the other: the keepalive
	// drain must notice an expired lease within its TTL however long the
	// key's watch takes to come back (without quorum, re-opening a watch
	// blocks until etcd confirms it).
	lost := make(chan error, 2)
	wg.Go(func() {
		for {
			select {
			case ka, ok := <-c.ka:
				if !ok {
					lost <- fmt.Errorf("liveness key %s: its %s etcd lease expired (etcd unreachable?)", key, m.opts.LivenessTTL)
					return
				}
				m.reg.head.observe(ka.ResponseHeader, time.Duration(ka.TTL)*time.Second)
			case <-kctx.Done():
				return
			}
		}
	})
	wg.Go(func() {
		if err := m.watchLivenessKey(kctx, key, c); err != nil {
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
// its lease lives on (etcdctl del) or is overwritten onto another etcd
// lease (an older overlayd of a clone, or an operator), and nil when ctx
// ends. A broken watch (a leader change, a failover) is no loss by itself —
// the keepalive says whether the session holds: it looks whether the key is
// still this claim's, then watches again.
func (m *nodeClaim) watchLivenessKey(ctx context.Context, key string, c *liveClaim) error {
	rev := c.rev
	lost := func(kv *mvccpb.KeyValue) error {
		switch {
		case kv == nil:
			return fmt.Errorf("liveness key %s was deleted", key)
		case clientv3.LeaseID(kv.Lease) != c.lease:
			return fmt.Errorf("liveness key %s was overwritten: %q", key, kv.Value)
		}
		return nil
	}
	for {
		wch := m.reg.cli.Watch(ownStream(clientv3.WithRequireLeader(ctx), "liveness"), key, clientv3.WithRev(rev+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				kv := ev.Kv
				if ev.Type == clientv3.EventTypeDelete {
					kv = nil
				}
				if err := lost(kv); err != nil {
					return err
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
			var kv *mvccpb.KeyValue
			if len(resp.Kvs) > 0 {
				kv = resp.Kvs[0]
			}
			if err := lost(kv); err != nil {
				return err
			}
			rev = resp.Header.Revision
		}
	}
}

// LiveNode is a liveness key as tools read it: the node ID its key names
// and the addresses and host name its value gives ("" where it gives
// none, or the value does not decode).
type LiveNode struct {
	NodeID, PublicIP, PublicIPv6, Hostname string
}

// LiveNodes reads every liveness key under NodesPrefix: the hosts running
// overlayd now, with their underlay addresses.
func (r *Registry) LiveNodes(ctx context.Context) ([]LiveNode, error) {
	resp, err := r.cli.Get(ctx, r.NodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r.NodesPrefix(), err)
	}
	nodes := make([]LiveNode, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		n := LiveNode{NodeID: string(kv.Key[len(r.NodesPrefix()):])}
		var v livenessValue
		if len(kv.Value) <= subnet.MaxLeaseValueSize && json.Unmarshal(kv.Value, &v) == nil {
			n.PublicIP, n.PublicIPv6, n.Hostname = v.PublicIP, v.PublicIPv6, v.Hostname
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}
