package main

import (
	"encoding/json"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// putLeases writes n leases of the network 10.0.0.0/8, each under an etcd
// lease of its own (lease list asks etcd for each one's TTL), 100 keys to a
// transaction.
func putLeases(t *testing.T, reg *etcdv3.Registry, n int) {
	t.Helper()
	cli := reg.Client()
	ids := make([]clientv3.LeaseID, n)
	var wg sync.WaitGroup
	for w := range 8 { // grants cannot be batched: a few at a time
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				resp, err := cli.Grant(ctx(t), 3600)
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = resp.ID
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(n, i+100); j++ {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j >> 8), byte(j), 0}), 24)
			a := subnet.NewAttrs(netip.AddrFrom4([4]byte{198, 18, byte(j >> 8), byte(j)}), subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(net.HardwareAddr{0x0e, 0, 0, 0, byte(j >> 8), byte(j)}), "", "")
			val, err := a.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(reg.Keys.LeaseKey(subnet.Subnets{IPv4: p}), string(val), clientv3.WithLease(ids[j])))
		}
		if _, err := cli.Txn(ctx(t)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// --dial-timeout bounds each etcd request, as its help says, not the whole
// command: lease list of 2,000 leases makes a request per lease (its TTL),
// which together take longer than the bound although none is slow.
func TestDialTimeoutBoundsEachRequest(t *testing.T) {
	const n = 2000
	srv, reg := cluster(t)
	if _, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.0.0.0/8"}`)); err != nil {
		t.Fatal(err)
	}
	putLeases(t, reg, n)

	start := time.Now()
	if r := run(t, srv.Endpoint, "", "lease", "list", "-w", "json"); r.code != exitOK {
		t.Fatalf("lease list: %+v", r)
	}
	// Half of what the whole command takes, yet far more than any one of
	// its requests needs (the longest, a page of 1,000 keys, is a tenth).
	bound := time.Since(start) / 2
	r := run(t, srv.Endpoint, "", "--dial-timeout", bound.String(), "lease", "list", "-w", "json")
	if r.code != exitOK {
		t.Fatalf("lease list --dial-timeout %s (a quarter of the command's time): exit %d: %s", bound, r.code, r.err)
	}
	var out struct{ Leases []leaseRow }
	if err := json.Unmarshal([]byte(r.out), &out); err != nil || len(out.Leases) != n {
		t.Fatalf("lease list -w json: %d leases (%v); want %d", len(out.Leases), err, n)
	}
	if l := out.Leases[0]; l.TTLSeconds <= 0 || l.TTLSeconds > 3600 {
		t.Errorf("first lease's TTL %d; want its etcd lease's", l.TTLSeconds)
	}
}
