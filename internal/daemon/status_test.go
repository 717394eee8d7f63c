package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// lostKey is a lease manager whose lease key has just gone.
type lostKey struct{ lease subnet.Lease }

func (m lostKey) Lease() subnet.Lease { return m.lease }
func (m lostKey) Expires() time.Time  { return time.Time{} }
func (m lostKey) KeyProblem() error   { return errors.New("lease key K was deleted") }

// The lease condition names the subnets being re-claimed: on an IPv6-only
// host the IPv6 subnet (not "invalid Prefix"), on a dual-stack host both.
func TestLeaseConditionNamesEachSubnet(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")
	for _, tc := range []struct {
		lease subnet.Lease
		want  string
	}{
		{subnet.Lease{Subnet: v4}, "lease key K was deleted; re-claiming 10.244.7.0/24"},
		{subnet.Lease{IPv6Subnet: v6}, "lease key K was deleted; re-claiming fd00:10:244:7::/64"},
		{subnet.Lease{Subnet: v4, IPv6Subnet: v6}, "lease key K was deleted; re-claiming 10.244.7.0/24&fd00:10:244:7::/64"},
	} {
		if got := leaseCondition(lostKey{tc.lease}, time.Now(), "").Reason; got != tc.want {
			t.Errorf("reason %q, want %q", got, tc.want)
		}
	}
}

// operations.md's readiness table quotes the device and reconcile
// conditions' reasons as the code words them.
func TestReadinessReasonsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := backend.Status{Device: "overlay.1"}, backend.Status{Device: "overlay-v6.1"}
	failed := backend.Status{Device: "overlay.1", LastPass: time.Now(), LastError: errors.New("…")}
	for _, reason := range []string{
		deviceCondition([]backend.Status{v4}).Reason,
		deviceCondition([]backend.Status{v4, v6}).Reason,
		reconcileCondition([]backend.Status{v4}).Reason,
		reconcileCondition([]backend.Status{failed}).Reason,
		(&peerSet{ownSkip: &rejection{Key: "<key>", Err: errors.New("<why>")}}).ownProblem(),
		(&peerSet{ownSkip: &rejection{Key: "<key>", Err: errors.New("<why>"), Kind: orphanedLease}}).ownProblem(),
	} {
		if !strings.Contains(string(doc), "`"+reason+"`") {
			t.Errorf("operations.md does not quote the reason %q", reason)
		}
	}
}

// heldLease is a lease manager that holds its lease, renewed.
type heldLease struct{ lease subnet.Lease }

func (m heldLease) Lease() subnet.Lease { return m.lease }
func (m heldLease) Expires() time.Time  { return time.Now().Add(time.Hour) }
func (m heldLease) KeyProblem() error   { return nil }

// A host whose own lease every host skips — invalid or orphaned, for any
// reason, while the lease manager holds it — is not ready: the lease
// condition says why (issue 28: a Network holding the hosts' own public
// IPs left every host ready with no peer programmed). It is ready again
// once the key holds a value every host programs.
func TestOwnLeaseSkippedByEveryHostIsNotReady(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"198.18.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	own := netip.MustParsePrefix("198.18.7.0/24")
	mgr := heldLease{subnet.Lease{Subnet: own}}
	ownLease := func(publicIP string, vni int, rev int64) subnet.Lease {
		l := lease(own.String(), publicIP, "0e:00:00:00:00:07", rev)
		l.Attrs.BackendData = []byte(fmt.Sprintf(`{"VNI":%d,"VtepMAC":"0e:00:00:00:00:07"}`, vni))
		return l
	}
	key := prefix + "198.18.7.0-24"
	s := newPeerSet(cfg, testCodec(t, cfg.Backend), subnet.Subnets{IPv4: own}, prefixed)
	for _, step := range []struct {
		name  string
		apply func()
		want  []string // in the reason; none: ready
	}{
		{"its public IP inside the network", func() {
			s.reset(subnet.Snapshot{Leases: []subnet.Lease{ownLease("198.18.100.1", 1, 1), lease("198.18.9.0/24", "203.0.113.9", "0e:00:00:00:00:09", 2)}})
		}, []string{"this host's lease " + key + " is invalid, so every host skips it and none routes to this host: ", "PublicIP 198.18.100.1 is inside the overlay network 198.18.0.0/16"}},
		{"fixed by an event", func() {
			s.apply(subnet.Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: ownLease("203.0.113.7", 1, 3)}}})
		}, nil},
		{"orphaned: another VNI", func() {
			s.apply(subnet.Batch{Events: []subnet.Event{{Type: subnet.Changed, Lease: ownLease("203.0.113.7", 2, 4)}}})
		}, []string{"this host's lease " + key + " is orphaned", "VNI 2 is not the network's Backend.VNI 1"}},
		{"undecodable", func() {
			s.apply(subnet.Batch{Invalid: []subnet.Invalid{{Key: key, Subnets: subnet.Subnets{IPv4: own}, ModRevision: 5, Err: errors.New("invalid lease: value is not a JSON object")}}})
		}, []string{"this host's lease " + key + " is invalid", "value is not a JSON object"}},
		{"fixed by a re-list", func() {
			s.reset(subnet.Snapshot{Leases: []subnet.Lease{ownLease("203.0.113.7", 1, 6)}})
		}, nil},
	} {
		step.apply()
		c := leaseCondition(mgr, time.Now(), s.ownProblem())
		if len(step.want) == 0 {
			if c.Reason != "" {
				t.Errorf("%s: lease condition %q, want ready", step.name, c.Reason)
			}
			continue
		}
		for _, w := range step.want {
			if !strings.Contains(c.Reason, w) {
				t.Errorf("%s: lease condition %q, want it to say %q", step.name, c.Reason, w)
			}
		}
	}
}

// operations.md quotes overlayd run's refusal of a public address inside
// the network as it is worded, for either family.
func TestPublicAddressInsideTheNetworkRefusalIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "Documentation", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"198.51.0.0/16","EnableIPv6":true,"IPv6Network":"2001:db8::/48"}`))
	if err != nil {
		t.Fatal(err)
	}
	ul := Underlay{Iface: "eth0", PublicIP: netip.MustParseAddr("198.51.100.7"), PublicIPv6: netip.MustParseAddr("2001:db9::7")}
	err = checkUnderlayOutside(cfg, ul, "/coreos.com/network/config")
	if err == nil || !strings.Contains(string(doc), "\nError: "+err.Error()+"\n") {
		t.Errorf("operations.md does not quote %v", err)
	}
	ul.PublicIP = netip.MustParseAddr("203.0.113.7")
	ul.PublicIPv6 = netip.MustParseAddr("2001:db8::7")
	want := "this host's public address 2001:db8::7 (interface eth0) is inside IPv6Network 2001:db8::/48 of /coreos.com/network/config: every host would skip its lease, as VXLAN to it would be routed into the overlay; store a config whose IPv6Network holds no host's underlay address (`overlayd config put`), or give this host another --public-ipv6"
	if err := checkUnderlayOutside(cfg, ul, "/coreos.com/network/config"); err == nil || err.Error() != want {
		t.Errorf("IPv6 address inside IPv6Network: %v, want %q", err, want)
	}
	ul.PublicIPv6 = netip.MustParseAddr("2001:db9::7")
	if err := checkUnderlayOutside(cfg, ul, "/coreos.com/network/config"); err != nil {
		t.Errorf("addresses outside both networks: %v", err)
	}
}
