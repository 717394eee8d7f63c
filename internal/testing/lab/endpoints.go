package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// UseEtcd points the lab at other etcd endpoints: every overlayd started
// from now on and every CLI call get --endpoints=eps instead of the lab's
// own etcd — the members of a multi-member cluster (etcdtest.StartCluster),
// or a Proxy in front of the lab's own etcd so that its clients can be cut
// off while it keeps running. The lab's network config is put there unless
// a config exists. The lab's own etcd keeps running (stop it if it is not
// used); DirectEndpoint and DirectClient still reach it. Call it before
// starting any host.
func (l *Lab) UseEtcd(ctx context.Context, eps ...string) error {
	if len(eps) == 0 {
		return fmt.Errorf("lab: UseEtcd needs endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client for %s: %w", strings.Join(eps, ","), err)
	}
	defer cli.Close()
	reg := etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix)
	resp, err := cli.Get(ctx, reg.Keys.ConfigKey())
	if err != nil {
		return fmt.Errorf("read the network config at %s: %w", strings.Join(eps, ","), err)
	}
	if len(resp.Kvs) == 0 {
		if _, err := reg.PutConfig(ctx, []byte(l.cfg.NetworkConfig)); err != nil {
			return fmt.Errorf("put the network config at %s: %w", strings.Join(eps, ","), err)
		}
	}
	l.Etcd.mu.Lock()
	l.Etcd.endpoint = strings.Join(eps, ",")
	l.Etcd.mu.Unlock()
	return nil
}

// DirectEndpoint is the client URL of the lab's own etcd, whatever UseEtcd
// pointed the hosts at.
func (e *Etcd) DirectEndpoint() string { return "unix://" + e.sock }

// DirectClient returns a new client of the lab's own etcd; the caller
// closes it.
func (e *Etcd) DirectClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.DirectEndpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", e.DirectEndpoint(), err)
	}
	return cli, nil
}

// Readyz asks the host's overlayd for /readyz: whether it is ready and,
// if not, the body naming the failing conditions.
func (n *Node) Readyz(ctx context.Context) (ready bool, body string, err error) {
	code, b, err := n.get(ctx, "/readyz")
	if err != nil {
		return false, "", err
	}
	return code == 200, strings.TrimSpace(string(b)), nil
}

// Metrics fetches the host's /metrics (Prometheus text).
func (n *Node) Metrics(ctx context.Context) (string, error) {
	code, b, err := n.get(ctx, "/metrics")
	if err != nil {
		return "", err
	}
	if code != 200 {
		return "", fmt.Errorf("%s /metrics: HTTP %d", n.Name, code)
	}
	return string(b), nil
}
