package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/overlaynet/overlay/internal/lib/backoff"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/kube/nodes"
)

// keepCheck is how often Keep checks this node without being told it
// changed: the API server's answer, while the watch is failing.
const keepCheck = 30 * time.Second

// Keep runs once the data path is in place (subnet.Source: the daemon
// calls it after its devices are up and subnet.env is written), so it
// first sets this node's NetworkUnavailable condition to false, as
// flanneld does once its backend is up. Then, each time this node
// changes: its annotations are published again if someone removed or
// changed them; a podCIDR that changed ends it with ErrPodCIDRChanged
// (pods hold addresses of the old one: restart overlayd, and the pods);
// a deleted node is a KeyProblem until the kubelet registers it again.
func (s *Source) Keep(ctx context.Context) error {
	tick := time.NewTicker(keepCheck)
	defer tick.Stop()
	var lastLog time.Time
	for {
		err := s.keepOnce(ctx)
		switch {
		case errors.Is(err, ErrPodCIDRChanged):
			return err
		case err != nil && ctx.Err() == nil && time.Since(lastLog) >= backoff.WarnEvery:
			s.cfg.Logger.Warn("cannot keep this node's lease published; retrying", "node", s.cfg.NodeName, "err", err)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.ownKick:
		case <-tick.C:
		}
	}
}

// keepOnce checks this node once.
func (s *Source) keepOnce(ctx context.Context) error {
	s.checkLiveness(ctx)
	n := s.node(s.cfg.NodeName)
	if n == nil {
		s.setProblem(fmt.Errorf("node %s was deleted; waiting for the kubelet to register it again", s.cfg.NodeName))
		return nil
	}
	v := *view(n)
	sn, err := nodes.PodCIDRs(v)
	held := s.Held().Lease()
	switch {
	case err != nil:
		s.setProblem(fmt.Errorf("node %s: %w", s.cfg.NodeName, err))
		return nil
	case s.netCfg.EnableIPv4 && sn.IPv4 != held.Subnet, s.netCfg.EnableIPv6 && sn.IPv6 != held.IPv6Subnet:
		return fmt.Errorf("%w: node %s's podCIDRs are now %q, this host's pods hold addresses of %s: restart overlayd and the node's pods", ErrPodCIDRChanged, s.cfg.NodeName, n.Spec.PodCIDRs, held.Subnets())
	}
	s.setProblem(nil)
	if err := s.publish(ctx, v); err != nil {
		return err
	}
	if s.cfg.SetNetworkUnavailable && !networkAvailable(n) {
		return s.markAvailable(ctx)
	}
	return nil
}

func (s *Source) setProblem(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problem = err
}

// checkLiveness asks the API server for this node while the watch is
// failing, so that readiness says when it answers again.
func (s *Source) checkLiveness(ctx context.Context) {
	s.mu.Lock()
	failing := s.liveErr != nil
	s.mu.Unlock()
	if !failing {
		return
	}
	if _, err := s.cli.get(ctx, s.cfg.NodeName); err == nil || !errors.Is(err, context.Canceled) {
		s.mu.Lock()
		s.liveErr = err
		s.mu.Unlock()
	}
}

func networkAvailable(n *node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == condNetworkUnavailable {
			return c.Status == condFalse
		}
	}
	return false
}

// markAvailable sets the NetworkUnavailable condition to false (a
// strategic merge patch of nodes/status: conditions merge by type).
func (s *Source) markAvailable(ctx context.Context) error {
	now := metav1.Now()
	cond := nodeCondition{Type: condNetworkUnavailable, Status: condFalse,
		Reason: "OverlayIsUp", Message: "overlayd runs on this node", LastTransitionTime: now, LastHeartbeatTime: now}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []nodeCondition{cond}}})
	if err != nil {
		return err
	}
	if err := s.cli.patch(ctx, s.cfg.NodeName, "status", types.StrategicMergePatchType, patch); err != nil {
		return fmt.Errorf("set node %s's NetworkUnavailable condition to false: %w%s", s.cfg.NodeName, err, hint(err))
	}
	s.cfg.Logger.Info("set the node's NetworkUnavailable condition to false", "node", s.cfg.NodeName)
	return nil
}

// Watch follows every other node from snap (Acquire's), delivering a batch
// for each node that changed as a lease; a node that changed in nothing
// the lease says (a heartbeat, a label) delivers nothing. The informer
// lists again by itself after a failed watch; its updates arrive here
// like any other.
func (s *Source) Watch(ctx context.Context, _ subnet.Snapshot, opts subnet.WatchOptions) <-chan subnet.Batch {
	out := make(chan subnet.Batch)
	s.mu.Lock()
	s.onRestart = opts.OnRestart
	s.mu.Unlock()
	lookup := func(name string) *nodes.Node { return view(s.node(name)) }
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			}
			s.mu.Lock()
			names := make([]string, 0, len(s.dirty))
			for name := range s.dirty {
				names = append(names, name)
			}
			clear(s.dirty)
			s.mu.Unlock()
			slices.Sort(names)
			for _, name := range names {
				n := s.node(name)
				s.mu.Lock()
				b := s.tracker.Update(name, view(n), lookup)
				s.mu.Unlock()
				if b.Empty() {
					continue
				}
				if n != nil {
					b.Revision = nodes.Revision(n.ResourceVersion)
				}
				select {
				case out <- b:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// WatchConfig delivers the network config file as Config read it, then
// each change of it (read every ConfigPoll: a ConfigMap's update swaps
// the file), until ctx ends.
func (s *Source) WatchConfig(ctx context.Context) <-chan subnet.ConfigUpdate {
	out := make(chan subnet.ConfigUpdate)
	go func() {
		defer close(out)
		last, cfg := s.data, s.netCfg
		send := func(u subnet.ConfigUpdate) bool {
			select {
			case out <- u:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !send(subnet.ConfigUpdate{Config: cfg}) {
			return
		}
		tick := time.NewTicker(s.cfg.ConfigPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			data, cfg, err := subnet.ReadNetConf(s.cfg.NetConfPath)
			if err == nil && bytes.Equal(data, last) {
				continue
			}
			last = data
			if !send(subnet.ConfigUpdate{Config: cfg, Err: err}) {
				return
			}
		}
	}()
	return out
}

// Held is this node's lease, nil before Claim.
func (s *Source) Held() subnet.LeaseState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimed {
		return nil
	}
	return held{s}
}

type held struct{ s *Source }

func (h held) Lease() subnet.Lease {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.lease
}

// Expires is a day ahead, always: a podCIDR is the node's as long as the
// Node exists (flanneld's kube mode says the same).
func (h held) Expires() time.Time { return time.Now().Add(24 * time.Hour) }

// KeyProblem says why the node does not carry its lease now (deleted, no
// podCIDR), nil while it does.
func (h held) KeyProblem() error {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.problem
}

// Liveness is false, with the error, from a failed watch of Nodes until
// the API server answers again.
func (h held) Liveness() (bool, error) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.liveErr == nil, h.s.liveErr
}

// Release gives nothing back (the podCIDR is the node's, assigned by
// kube-controller-manager), but if this start made the node take part
// (it had no kube-subnet-manager annotation before), it removes that
// annotation so that peers stop routing to a host whose data path never
// came up. The other annotations stay: they name nothing without it.
func (s *Source) Release(ctx context.Context) (bool, error) {
	if !s.created {
		return false, nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{s.ann.Managed: nil}}})
	err := s.cli.patch(ctx, s.cfg.NodeName, "", types.MergePatchType, patch)
	if err == nil {
		s.created = false
	}
	return true, err
}

// IsFatal: bad client settings, a podCIDR that does not fit the network
// or changed under the running host.
func (s *Source) IsFatal(err error) bool {
	return errors.Is(err, ErrSettings) || errors.Is(err, ErrPodCIDR) || errors.Is(err, ErrPodCIDRChanged)
}

// Close stops the informer and waits for it.
func (s *Source) Close() {
	if s.stop != nil {
		s.stop()
		<-s.stopped
		s.stop = nil
	}
}
