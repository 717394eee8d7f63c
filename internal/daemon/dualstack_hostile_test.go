package daemon

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// In a dual-stack network, keys and values that are wrong in their IPv6
// half are never programmed in either family, each is counted as invalid
// or orphaned, and the valid dual-stack peers written among them are
// programmed on both devices. (A key with no IPv6 half at all is a host
// not yet restarted since IPv6 was turned on: its IPv4 half is programmed,
// see TestWiringIPv6RollOnAndOff.)
func TestHostileDualStackLeasesAreNeverProgrammed(t *testing.T) {
	c := newCluster(t)
	if _, err := c.reg.PutConfig(tctx(t), []byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)); err != nil {
		t.Fatal(err)
	}
	h1 := c.addHost("h1", 1)
	var ln net.Listener
	if err := lab.Do(h1.host.NS, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	h1.cfg.HealthListener = ln
	client := nsHTTPClient(h1.host.NS)
	// Pin h1's subnets (an old subnet.env is reused when free) away from
	// every subnet written below: a random pick there would make a peer
	// overlap h1's own lease.
	pinned := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.50.0/24"), 1430, true).
		WithIPv6(netip.MustParsePrefix("fd00:10:244::/56"), netip.MustParsePrefix("fd00:10:244:32::/64"))
	if err := os.MkdirAll(filepath.Dir(h1.cfg.SubnetFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := subnet.WriteEnv(h1.cfg.SubnetFile, pinned); err != nil {
		t.Fatal(err)
	}
	h1.start(t)
	testenv.Eventually(t, testenv.Slack, "h1 ready", func() error {
		if code, body := get(t, client, "http://"+ln.Addr().String()+"/readyz"); code != 200 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	if own := h1.env(t); own.Lease() != pinned.Lease() || own.IPv6Lease() != pinned.IPv6Lease() {
		t.Fatalf("h1 took %s and %s, not the subnets of its old subnet.env", own.Lease(), own.IPv6Lease())
	}

	value := func(ip, ip6, mac6 string) string {
		return fmt.Sprintf(`{"PublicIP":%q,"PublicIPv6":%q,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:04:01"},"BackendV6Data":{"VNI":1,"VtepMAC":%q}}`, ip, ip6, mac6)
	}
	good := value("198.18.0.40", "fd18::40", "0e:00:00:00:06:01")
	hostile := []struct {
		kind, key, value string
		orphan           bool
	}{
		{"IPv6 half not canonical", "10.244.201.0-24&FD00:10:244:9::-64", good, false},
		{"IPv6 half with host bits", "10.244.202.0-24&fd00:10:244:9::1-64", good, false},
		{"IPv6 half not an address", "10.244.203.0-24&fd00:10:244:zz::-64", good, false},
		{"IPv6 subnet outside IPv6Network", "10.244.204.0-24&fd99::-64", good, true},
		{"IPv6 subnet of another length", "10.244.205.0-24&fd00:10:244:9::-80", good, true},
		{"multicast PublicIPv6", "10.244.207.0-24&fd00:10:244:7::-64", value("198.18.0.40", "ff02::1", "0e:00:00:00:06:01"), false},
		{"loopback PublicIPv6", "10.244.208.0-24&fd00:10:244:8::-64", value("198.18.0.40", "::1", "0e:00:00:00:06:01"), false},
		{"no PublicIPv6", "10.244.209.0-24&fd00:10:244:9::-64", value("198.18.0.40", "", "0e:00:00:00:06:01"), false},
		{"PublicIPv6 inside the network", "10.244.210.0-24&fd00:10:244:a::-64", value("198.18.0.40", "fd00:10:244:3::5", "0e:00:00:00:06:01"), false},
		{"zero IPv6 VTEP MAC", "10.244.211.0-24&fd00:10:244:b::-64", value("198.18.0.40", "fd18::40", "00:00:00:00:00:00"), false},
		{"multicast IPv6 VTEP MAC", "10.244.212.0-24&fd00:10:244:c::-64", value("198.18.0.40", "fd18::40", "33:33:00:00:00:01"), false},
	}
	cli := c.reg.Client()
	put := func(key, value string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
		defer cancel()
		if _, err := cli.Put(ctx, c.reg.Keys.SubnetsPrefix()+key, value); err != nil {
			t.Fatal(err)
		}
	}
	valid4, valid6 := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
	wantInvalid, wantOrphaned := 0, 0
	for i, h := range hostile {
		put(h.key, h.value)
		if h.orphan {
			wantOrphaned++
		} else {
			wantInvalid++
		}
		// A valid dual-stack peer between the hostile writes.
		p4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i), 0}), 24)
		p6 := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44, 0, byte(0x80 + i)}), 64)
		put(p4.Addr().String()+"-24&"+p6.Addr().String()+"-64",
			fmt.Sprintf(`{"PublicIP":"198.18.0.%d","PublicIPv6":"fd18::%x","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:01:%02x"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:02:%02x"}}`, 100+i, 0x100+i, i, i))
		valid4[p4], valid6[p6] = true, true
	}
	testenv.Eventually(t, 3*testenv.Slack, "valid peers programmed on both devices and every hostile key counted", func() error {
		got4, got6 := h1.routesOf(t, unix.AF_INET), h1.routesOf(t, unix.AF_INET6)
		for p := range valid4 {
			if !got4[p] {
				return fmt.Errorf("valid peer %s not programmed", p)
			}
		}
		for p := range valid6 {
			if !got6[p] {
				return fmt.Errorf("valid peer %s not programmed", p)
			}
		}
		_, body := get(t, client, "http://"+ln.Addr().String()+"/metrics")
		if inv, orph := metricValue(body, "overlay_leases_invalid"), metricValue(body, "overlay_leases_orphaned"); inv != wantInvalid || orph != wantOrphaned {
			return fmt.Errorf("invalid %d, orphaned %d; want %d and %d", inv, orph, wantInvalid, wantOrphaned)
		}
		return nil
	})
	for fam, valid := range map[int]map[netip.Prefix]bool{unix.AF_INET: valid4, unix.AF_INET6: valid6} {
		for p := range h1.routesOf(t, fam) {
			if !valid[p] {
				t.Errorf("programmed %s, which only a hostile write named", p)
			}
		}
	}
	select {
	case err := <-h1.done:
		t.Fatalf("the daemon exited: %v", err)
	default:
	}
}
