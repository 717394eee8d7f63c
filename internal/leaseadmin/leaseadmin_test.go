package leaseadmin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// fakeStore is a Store in memory: a listing, a config, and the
// reservations written, with errors to inject. The rules are pure logic
// over it; cmd/overlayd's tests run the same rules against a real etcd.
type fakeStore struct {
	snap       subnet.Snapshot
	cfg        *subnet.Config
	cfgErr     error
	listErr    error
	reserveErr error
	reserved   []reservation
}

type reservation struct {
	s     subnet.Subnets
	attrs subnet.LeaseAttrs
	rev   int64
}

const prefix = "/coreos.com/network"

func (f *fakeStore) List(context.Context) (subnet.Snapshot, error) { return f.snap, f.listErr }
func (f *fakeStore) GetConfig(context.Context) (*subnet.Config, []byte, error) {
	if f.cfgErr != nil {
		return nil, nil, f.cfgErr
	}
	return f.cfg, nil, nil
}
func (f *fakeStore) Reserve(_ context.Context, s subnet.Subnets, a subnet.LeaseAttrs, rev int64) (int64, error) {
	if f.reserveErr != nil {
		return 0, f.reserveErr
	}
	f.reserved = append(f.reserved, reservation{s, a, rev})
	return rev + 1, nil
}
func (f *fakeStore) ConfigKey() string                { return prefix + "/config" }
func (f *fakeStore) LeaseKey(s subnet.Subnets) string { return prefix + "/subnets/" + s.Key() }
func (f *fakeStore) ParseKey(key string) (subnet.Subnets, error) {
	return subnet.ParseLeaseKey(strings.TrimPrefix(key, prefix+"/subnets/"))
}

func config(t *testing.T, raw string) *subnet.Config {
	t.Helper()
	cfg, err := subnet.ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// hostLease is host n's lease of 10.244.n.0/24 as a daemon writes it.
func hostLease(n int, node string) subnet.Lease {
	mac := net.HardwareAddr{0x0e, 0, 0, 0, 0, byte(n)}
	return subnet.Lease{
		Subnet:    netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n)),
		Attrs:     subnet.NewAttrs(netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", n)), subnet.DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(mac), node, ""),
		EtcdLease: int64(100 + n),
	}
}

// reservationOf is a reservation as `lease reserve` writes it.
func reservationOf(sub, publicIP, node string) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Reserved: true,
		Attrs: subnet.LeaseAttrs{PublicIP: publicIP, BackendType: subnet.DefaultBackendType, NodeID: node}}
}

func subnets(v4 string) subnet.Subnets { return subnet.Subnets{IPv4: netip.MustParsePrefix(v4)} }

const network = `{"Network":"10.244.0.0/16"}`

func TestReserve(t *testing.T) {
	attrs := subnet.LeaseAttrs{PublicIP: "198.18.0.9", BackendType: subnet.DefaultBackendType, NodeID: "h9"}
	for _, tc := range []struct {
		name    string
		store   fakeStore
		s       string
		attrs   subnet.LeaseAttrs
		force   bool
		refused string // in the Refusal; "" for a write
		err     error  // a store failure, passed on as it is
		warning string
	}{
		{name: "a free subnet is written at the listing's revision", s: "10.244.9.0/24", attrs: attrs},
		{name: "the host already has a lease", store: fakeStore{snap: subnet.Snapshot{Leases: []subnet.Lease{hostLease(3, "h9")}}},
			s: "10.244.9.0/24", attrs: attrs, refused: "node h9 already has 10.244.3.0/24 (key /coreos.com/network/subnets/10.244.3.0-24)"},
		{name: "the host's public IP already has a reservation", store: fakeStore{snap: subnet.Snapshot{Leases: []subnet.Lease{reservationOf("10.244.4.0/24", "198.18.0.9", "")}}},
			s: "10.244.9.0/24", attrs: attrs, refused: "public IP 198.18.0.9 already has 10.244.4.0/24"},
		{name: "an undecodable key still holds its subnet", store: fakeStore{snap: subnet.Snapshot{Invalid: []subnet.Invalid{{Key: prefix + "/subnets/10.244.9.0-24&fd00::-64", Err: subnet.ErrInvalidLease}}}},
			s: "10.244.9.0/24", attrs: attrs, refused: "10.244.9.0/24 is already held by key /coreos.com/network/subnets/10.244.9.0-24&fd00::-64"},
		{name: "outside the network", s: "10.99.9.0/24", attrs: attrs, refused: "daemons would skip it"},
		{name: "a public IP inside the network", s: "10.244.9.0/24", attrs: subnet.LeaseAttrs{PublicIP: "10.244.200.1", BackendType: subnet.DefaultBackendType},
			refused: "pass the host's underlay address as --public-ip"},
		{name: "the network's first subnet", s: "10.244.0.0/24", attrs: attrs, refused: "pass --force to reserve it all the same"},
		{name: "the network's first subnet with --force", s: "10.244.0.0/24", attrs: attrs, force: true, warning: "warning: reserved with --force: 10.244.0.0/24 is the first subnet"},
		{name: "an IPv6 subnet in an IPv4-only network", s: "10.244.9.0/24", attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.9", PublicIPv6: "2001:db8::9"}, refused: "drop --ipv6-subnet and --public-ipv6"},
		{name: "the key is taken meanwhile", store: fakeStore{reserveErr: fmt.Errorf("%w: key", etcdv3.ErrTaken)},
			s: "10.244.9.0/24", attrs: attrs, refused: "it is already leased (see `overlayd lease get 10.244.9.0/24`; revoke it first)"},
		{name: "another lease was written meanwhile", store: fakeStore{reserveErr: etcdv3.ErrConflict}, s: "10.244.9.0/24", attrs: attrs, err: etcdv3.ErrConflict},
		{name: "etcd fails the listing", store: fakeStore{listErr: context.DeadlineExceeded}, s: "10.244.9.0/24", attrs: attrs, err: context.DeadlineExceeded},
		{name: "no config", store: fakeStore{cfgErr: etcdv3.ErrNoConfig}, s: "10.244.9.0/24", attrs: attrs, err: etcdv3.ErrNoConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.store
			st.snap.Revision = 42
			if st.cfg == nil {
				st.cfg = config(t, network)
			}
			var warn bytes.Buffer
			err := Reserve(context.Background(), &st, subnets(tc.s), tc.attrs, tc.force, &warn)
			var refused Refusal
			switch {
			case tc.refused != "":
				if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.refused) {
					t.Errorf("Reserve = %v, want a refusal saying %q", err, tc.refused)
				}
			case tc.err != nil:
				if !errors.Is(err, tc.err) || errors.As(err, &refused) {
					t.Errorf("Reserve = %v, want the store's %v, not a refusal", err, tc.err)
				}
			case err != nil:
				t.Fatalf("Reserve = %v, want a write", err)
			case len(st.reserved) != 1 || st.reserved[0].s != subnets(tc.s) || st.reserved[0].rev != 42 || !reflect.DeepEqual(st.reserved[0].attrs, tc.attrs):
				t.Errorf("wrote %+v, want one reservation of %s at revision 42", st.reserved, tc.s)
			}
			if (err != nil) && len(st.reserved) > 0 {
				t.Errorf("refused or failed, yet wrote %+v", st.reserved)
			}
			if !strings.HasPrefix(warn.String(), tc.warning) || (tc.warning == "") != (warn.Len() == 0) {
				t.Errorf("warnings %q, want %q", warn.String(), tc.warning)
			}
		})
	}
}

func TestState(t *testing.T) {
	cfg := config(t, network)
	bad := hostLease(5, "h5")
	bad.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"not-a-mac"}`)
	outside := hostLease(5, "h5")
	outside.Subnet = netip.MustParsePrefix("10.99.5.0/24")
	adopted := hostLease(6, "h6")
	adopted.Reserved, adopted.EtcdLease = true, 0
	for _, tc := range []struct {
		name      string
		cfg       *subnet.Config
		l         subnet.Lease
		want      string
		inProblem string
	}{
		{"a host's lease", cfg, hostLease(5, "h5"), StateLeased, ""},
		{"no valid config", nil, hostLease(5, "h5"), StateUnknown, ""},
		{"a bad MAC", cfg, bad, StateInvalid, "not-a-mac"},
		{"outside the network", cfg, outside, StateOrphaned, "outside Network 10.244.0.0/16"},
		{"an unadopted reservation", cfg, reservationOf("10.244.7.0/24", "198.18.0.7", ""), StateReserved, ""},
		{"an adopted reservation", cfg, adopted, StateReserved, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, problem := State(tc.cfg, tc.l)
			if state != tc.want || !strings.Contains(problem, tc.inProblem) || (tc.inProblem == "") != (problem == "") {
				t.Errorf("State = %s, %q; want %s, %q", state, problem, tc.want, tc.inProblem)
			}
		})
	}
}

func TestUnusedByItsHost(t *testing.T) {
	cfg := config(t, network)
	orphan := hostLease(5, "h5")
	orphan.Subnet = netip.MustParsePrefix("10.99.5.0/24")
	second := reservationOf("10.244.8.0/24", "", "h5")
	for _, tc := range []struct {
		name   string
		store  fakeStore
		l      subnet.Lease
		unused bool
	}{
		{"an orphan whose host holds a fitting lease", fakeStore{cfg: cfg, snap: subnet.Snapshot{Leases: []subnet.Lease{orphan, hostLease(6, "h5")}}}, orphan, true},
		{"an orphan, its host's only lease", fakeStore{cfg: cfg, snap: subnet.Snapshot{Leases: []subnet.Lease{orphan, hostLease(6, "h6")}}}, orphan, false},
		{"a second reservation of a host with a lease", fakeStore{cfg: cfg, snap: subnet.Snapshot{Leases: []subnet.Lease{second, hostLease(6, "h5")}}}, second, true},
		{"a fitting lease in use", fakeStore{cfg: cfg, snap: subnet.Snapshot{Leases: []subnet.Lease{hostLease(5, "h5"), hostLease(6, "h5")}}}, hostLease(5, "h5"), false},
		{"no config: nothing is known to be orphaned", fakeStore{cfgErr: etcdv3.ErrNoConfig, snap: subnet.Snapshot{Leases: []subnet.Lease{orphan, hostLease(6, "h5")}}}, orphan, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unused, err := UnusedByItsHost(context.Background(), &tc.store, tc.l)
			if err != nil || unused != tc.unused {
				t.Errorf("UnusedByItsHost = %v, %v; want %v", unused, err, tc.unused)
			}
		})
	}
	st := fakeStore{cfg: cfg, listErr: context.Canceled}
	if _, err := UnusedByItsHost(context.Background(), &st, orphan); !errors.Is(err, context.Canceled) {
		t.Errorf("a failed listing: %v, want it passed on", err)
	}
}

func TestStrandedLeases(t *testing.T) {
	prev := config(t, network)
	leases := []subnet.Lease{hostLease(200, "h200"), hostLease(5, "h5"), reservationOf("10.244.9.0/24", "198.18.0.9", "")}
	var got []string
	for _, s := range StrandedLeases(prev, config(t, `{"Network":"10.244.0.0/17"}`), leases) {
		got = append(got, s.String())
	}
	if want := []string{"10.244.200.0/24 of node h200 (198.18.0.200): subnet 10.244.200.0/24 is outside Network 10.244.0.0/17"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("a smaller network strands %q, want %q", got, want)
	}
	got = nil
	ported := StrandedLeases(prev, config(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","Port":4789}}`), leases)
	for _, s := range ported {
		got = append(got, s.String())
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "10.244.5.0/24 of node h5") || !strings.Contains(got[1], "Backend.Port 4789") {
		t.Errorf("a new port strands %q, want both hosts' leases (not the unadopted reservation), in address order", got)
	}
	if hosts := StrandedHosts(ported); hosts != "node h5 (198.18.0.5), node h200 (198.18.0.200)" {
		t.Errorf("StrandedHosts = %q", hosts)
	}
	if s := StrandedLeases(nil, prev, leases); len(s) != 0 {
		t.Errorf("a first config strands %v, want none", s)
	}
}

func TestDescribeOwner(t *testing.T) {
	for _, tc := range []struct {
		a    subnet.LeaseAttrs
		want string
	}{
		{subnet.LeaseAttrs{}, "unknown: the value names no host"},
		{subnet.LeaseAttrs{PublicIP: "198.18.0.7"}, "198.18.0.7"},
		{subnet.LeaseAttrs{NodeID: "h7"}, "node h7"},
		{subnet.LeaseAttrs{NodeID: "h7", PublicIP: "198.18.0.7", PublicIPv6: "2001:db8::7"}, "node h7 (198.18.0.7, 2001:db8::7)"},
		{subnet.LeaseAttrs{NodeID: "h7\x1b[2J", PublicIP: "198.18.0.7\nfake line"}, `node "h7\x1b[2J" ("198.18.0.7\nfake line")`},
	} {
		if got := DescribeOwner(tc.a); got != tc.want {
			t.Errorf("DescribeOwner(%+v) = %q, want %q", tc.a, got, tc.want)
		}
	}
}

// Both halves of a dual-stack reservation are checked against their
// family's range.
func TestOutsideRangeNamesEachFamily(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","IPv6SubnetMax":"fd00:10:244:f0::"}`))
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		s    subnet.Subnets
		want string
	}{
		{subnet.Subnets{IPv4: p("10.244.7.0/24"), IPv6: p("fd00:10:244:7::/64")}, ""},
		{subnet.Subnets{IPv4: p("10.244.7.0/24"), IPv6: p("fd00:10:244::/64")}, "fd00:10:244::/64 is the first subnet of fd00:10:244::/56, which no host leases (its address is the network's own; IPv6SubnetMin is fd00:10:244:1::)"},
		{subnet.Subnets{IPv4: p("10.244.7.0/24"), IPv6: p("fd00:10:244:f1::/64")}, "fd00:10:244:f1::/64 is above IPv6SubnetMax fd00:10:244:f0::, outside the range hosts lease from"},
		{subnet.Subnets{IPv4: p("10.244.0.0/24"), IPv6: p("fd00:10:244:7::/64")}, "10.244.0.0/24 is the first subnet of 10.244.0.0/16"},
	} {
		if got := OutsideRange(cfg, tc.s); !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
			t.Errorf("OutsideRange(%s) = %q, want %q", tc.s, got, tc.want)
		}
	}
	if got := rangeWanted(cfg); got != "a /24 between SubnetMin 10.244.1.0 and SubnetMax 10.244.255.0 and a /64 between IPv6SubnetMin fd00:10:244:1:: and IPv6SubnetMax fd00:10:244:f0::" {
		t.Errorf("rangeWanted = %q", got)
	}
}

func TestRefuseRevoke(t *testing.T) {
	flannels := hostLease(4, "")
	alive := map[string]bool{"h5": true}
	for _, tc := range []struct {
		name string
		l    subnet.Lease
		want string // "" to allow
	}{
		{"a live owner's lease", hostLease(5, "h5"), "refusing to revoke 10.244.5.0/24: its owner node h5 (198.18.0.5) is alive and would re-claim it"},
		{"a dead owner's lease", hostLease(6, "h6"), ""},
		{"a lease without a node ID", flannels, "cannot tell whether its owner 198.18.0.4 is alive"},
		{"a reservation without a node ID", reservationOf("10.244.7.0/24", "198.18.0.7", ""), ""},
		{"a live node's reservation", reservationOf("10.244.7.0/24", "", "h5"), "its owner node h5 is alive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RefuseRevoke(tc.l, alive)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("RefuseRevoke = %v, want %q", err, tc.want)
			}
		})
	}
}

// A config whose Backend.Type has no codec (subnet.ParseConfig refuses
// one, but a Config can be built by hand) judges nothing as VXLAN: a
// lease's state is unknown, and a change to it strands every lease, each
// saying why.
func TestABackendWithoutACodecJudgesNothing(t *testing.T) {
	cfg := config(t, `{"Network":"10.244.0.0/16"}`)
	other := *cfg
	other.Backend.Type = "wireguard"
	l := hostLease(7, "h7")
	if state, problem := State(&other, l); state != StateUnknown || !strings.Contains(problem, `Backend.Type "wireguard"`) {
		t.Errorf("State under a backend without a codec = %q, %q; want %q naming the type", state, problem, StateUnknown)
	}
	if state, _ := State(cfg, l); state != StateLeased {
		t.Errorf("State under vxlan = %q, want %q", state, StateLeased)
	}
	stranded := StrandedLeases(cfg, &other, []subnet.Lease{l, hostLease(8, "h8")})
	if len(stranded) != 2 || !strings.Contains(stranded[0].String(), `Backend.Type "wireguard"`) {
		t.Errorf("StrandedLeases to a backend without a codec = %v, want both leases, naming the type", stranded)
	}
}
