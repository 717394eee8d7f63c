package main

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// boundRequests makes each KV and lease request of cli wait at most
// timeout for etcd — --dial-timeout is "how long to wait for etcd on each
// request" — however many requests a command makes (lease list asks for
// one TTL per lease). It wraps the client's KV and Lease rather than adding
// a gRPC interceptor because the etcd client's retry interceptor is the
// outermost one: it would retry a request an inner deadline cut short, up
// to 100 times.
func boundRequests(cli *clientv3.Client, timeout time.Duration) {
	cli.KV = boundKV{cli.KV, timeout}
	cli.Lease = boundLease{cli.Lease, timeout}
}

type boundKV struct {
	clientv3.KV
	timeout time.Duration
}

func (kv boundKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	defer cancel()
	return kv.KV.Get(ctx, key, opts...)
}

func (kv boundKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	defer cancel()
	return kv.KV.Put(ctx, key, val, opts...)
}

func (kv boundKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	defer cancel()
	return kv.KV.Delete(ctx, key, opts...)
}

func (kv boundKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	defer cancel()
	return kv.KV.Compact(ctx, rev, opts...)
}

func (kv boundKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	defer cancel()
	return kv.KV.Do(ctx, op)
}

// Txn's request is its Commit: the bound ends there.
func (kv boundKV) Txn(ctx context.Context) clientv3.Txn {
	ctx, cancel := context.WithTimeout(ctx, kv.timeout)
	return &boundTxn{kv.KV.Txn(ctx), cancel}
}

type boundTxn struct {
	txn    clientv3.Txn
	cancel context.CancelFunc
}

func (t *boundTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.txn = t.txn.If(cs...); return t }
func (t *boundTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.txn = t.txn.Then(ops...); return t }
func (t *boundTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.txn = t.txn.Else(ops...); return t }

func (t *boundTxn) Commit() (*clientv3.TxnResponse, error) {
	defer t.cancel()
	return t.txn.Commit()
}

// boundLease bounds the lease requests; KeepAlive is a stream that lives
// as long as its context, and is left alone.
type boundLease struct {
	clientv3.Lease
	timeout time.Duration
}

func (l boundLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.Lease.Grant(ctx, ttl)
}

func (l boundLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.Lease.Revoke(ctx, id)
}

func (l boundLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.Lease.TimeToLive(ctx, id, opts...)
}

func (l boundLease) Leases(ctx context.Context) (*clientv3.LeaseLeasesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.Lease.Leases(ctx)
}

func (l boundLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return l.Lease.KeepAliveOnce(ctx, id)
}
