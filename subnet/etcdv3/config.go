package etcdv3

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// GetConfig reads and validates the network config; it returns the raw bytes
// too, unknown fields included, for printing.
func (r *Registry) GetConfig(ctx context.Context) (*subnet.Config, []byte, error) {
	resp, err := r.cli.Get(ctx, r.ConfigKey())
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", r.ConfigKey(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil, r.configErr(false, nil)
	}
	raw := resp.Kvs[0].Value
	cfg, err := subnet.ParseConfig(raw)
	return cfg, raw, r.configErr(true, err)
}

// configErr explains a missing or invalid config.
func (k Keys) configErr(exists bool, err error) error {
	switch {
	case !exists:
		return fmt.Errorf("%w at %s: check that --prefix is the network's prefix (flanneld's --etcd-prefix), or create one with `overlayd config put -f net.json`", ErrNoConfig, k.ConfigKey())
	case err != nil:
		return fmt.Errorf("%s: %w: fix it with `overlayd config put -f net.json`", k.ConfigKey(), err)
	}
	return nil
}

// WatchConfig delivers the network config as it is now, then again each
// time <prefix>/config changes, until ctx ends (then the channel closes).
// A broken watch is re-established after retry, delivering the config as
// read then, so a change made meanwhile is not missed.
func (r *Registry) WatchConfig(ctx context.Context, retry time.Duration) <-chan ConfigUpdate {
	out := make(chan ConfigUpdate)
	w := configWatch{cli: r.cli, keys: r.Keys}
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
			resp, err := r.cli.Get(rctx, r.ConfigKey())
			cancel()
			if err == nil {
				if !sendConfig(ctx, out, w.update(resp.Kvs)) {
					return
				}
				w.follow(ctx, resp.Header.Revision, out)
			}
			if !sleepCtx(ctx, retry) {
				return
			}
		}
	}()
	return out
}

// configWatch is one watch of the config key (WatchConfig).
type configWatch struct {
	cli  *clientv3.Client
	keys Keys
}

// follow sends each change of the config key after rev until the
// watch breaks or ctx ends.
func (r configWatch) follow(ctx context.Context, rev int64, out chan<- ConfigUpdate) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range r.cli.Watch(ownStream(clientv3.WithRequireLeader(wctx), "config"), r.keys.ConfigKey(), clientv3.WithRev(rev+1)) {
		if wr.Err() != nil || wr.Canceled {
			return
		}
		for _, ev := range wr.Events {
			var kvs []*mvccpb.KeyValue
			if ev.Type == clientv3.EventTypePut {
				kvs = []*mvccpb.KeyValue{ev.Kv}
			}
			if !sendConfig(ctx, out, r.update(kvs)) {
				return
			}
		}
	}
}

// update is the config as kvs hold it (none: deleted).
func (r configWatch) update(kvs []*mvccpb.KeyValue) ConfigUpdate {
	if len(kvs) == 0 {
		return ConfigUpdate{Err: r.keys.configErr(false, nil)}
	}
	cfg, err := subnet.ParseConfig(kvs[0].Value)
	if err != nil {
		return ConfigUpdate{Err: r.keys.configErr(true, err)}
	}
	return ConfigUpdate{Config: cfg}
}

func sendConfig(ctx context.Context, out chan<- ConfigUpdate, u ConfigUpdate) bool {
	select {
	case out <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

// PutConfig validates raw and stores it unchanged (unknown fields kept).
func (r *Registry) PutConfig(ctx context.Context, raw []byte) (*subnet.Config, error) {
	cfg, err := subnet.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	if _, err := r.cli.Put(ctx, r.ConfigKey(), string(raw)); err != nil {
		return nil, fmt.Errorf("write %s: %w", r.ConfigKey(), err)
	}
	return cfg, nil
}

// PutConfigIfUnchanged validates raw and stores it unchanged only if
// neither the config nor any lease was written after revision rev, the
// revision of the listing the caller checked the change against.
func (r *Registry) PutConfigIfUnchanged(ctx context.Context, raw []byte, rev int64) (*subnet.Config, error) {
	cfg, err := subnet.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(r.ConfigKey()), "<", rev+1), r.unchangedSince(rev)).
		Then(clientv3.OpPut(r.ConfigKey(), string(raw))).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", r.ConfigKey(), err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%w: the config or a lease was written while checking the change", ErrConflict)
	}
	return cfg, nil
}
