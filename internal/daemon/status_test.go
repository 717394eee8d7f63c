package daemon

import (
	"errors"
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
		if got := leaseCondition(lostKey{tc.lease}, time.Now()).Reason; got != tc.want {
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
	} {
		if !strings.Contains(string(doc), "`"+reason+"`") {
			t.Errorf("operations.md does not quote the reason %q", reason)
		}
	}
}
