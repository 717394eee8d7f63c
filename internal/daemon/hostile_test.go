package daemon

import (
	"context"
	"fmt"
	"github.com/overlaynet/overlay/subnet"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// hostileWrite is one adversarial key/value written under <prefix>/subnets/.
type hostileWrite struct {
	kind, key, value string
}

// hostileWrites generates n corrupt or adversarial lease writes from rng:
// everything a buggy or malicious writer with etcd access could produce.
// own is the daemon's own subnet (garbage over it must be survived too).
func hostileWrites(rng *rand.Rand, n int, own netip.Prefix) []hostileWrite {
	// Random subnets other than our own: a plausible claim by another host
	// over our own key is a takeover (tested elsewhere), not hostile data.
	subnetKey := func() string {
		for {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + rng.IntN(100)), 0}), 24)
			if p != own {
				return p.Addr().String() + "-24"
			}
		}
	}
	// Every value differs (Hostname), so every write is a change to judge:
	// rewriting a key with an identical value is rightly not an event.
	nonce := 0
	value := func(ip, mac string) string {
		nonce++
		return fmt.Sprintf(`{"PublicIP":%q,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":%q},"Hostname":"w%d"}`, ip, mac, nonce)
	}
	goodMAC := func() string { return fmt.Sprintf("0e:00:00:00:%02x:%02x", rng.IntN(256), rng.IntN(256)) }
	gens := []func() hostileWrite{
		func() hostileWrite { return hostileWrite{"bad JSON", subnetKey(), `{"PublicIP":"198.18.0.9",`} },
		func() hostileWrite {
			return hostileWrite{"not an object", subnetKey(), []string{"null", "[]", `"x"`, "7", ""}[rng.IntN(5)]}
		},
		func() hostileWrite {
			return hostileWrite{"huge value", subnetKey(), `{"PublicIP":"198.18.0.9","Pad":"` + strings.Repeat("A", 100<<10) + `"}`}
		},
		func() hostileWrite {
			return hostileWrite{"deep nesting", subnetKey(), strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)}
		},
		func() hostileWrite {
			bits := []int{0, 8, 16, 23, 25, 30, 32}[rng.IntN(7)]
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + rng.IntN(100)), 0}), bits).Masked()
			return hostileWrite{"wrong prefix length", p.Addr().String() + "-" + strconv.Itoa(bits), value("198.18.0.9", goodMAC())}
		},
		func() hostileWrite {
			// Overlapping our own subnet with a longer or shorter prefix.
			half := netip.PrefixFrom(own.Addr(), own.Bits()+1)
			return hostileWrite{"overlaps own subnet", half.Addr().String() + "-" + strconv.Itoa(half.Bits()), value("198.18.0.9", goodMAC())}
		},
		func() hostileWrite {
			return hostileWrite{"outside the network", fmt.Sprintf("10.%d.0.0-24", 1+rng.IntN(200)), value("198.18.0.9", goodMAC())}
		},
		func() hostileWrite {
			ip := []string{"0.0.0.0", "255.255.255.255", "224.0.0.1", "239.1.2.3", "127.0.0.1", "240.0.0.1", "169.254.0.1", "10.244.3.3", "fd00::1", "", "::"}[rng.IntN(11)]
			return hostileWrite{"bad public IP " + ip, subnetKey(), value(ip, goodMAC())}
		},
		func() hostileWrite {
			mac := []string{"00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "33:33:00:00:00:01", "0e:00:00:00:00", "zz:zz:zz:zz:zz:zz", "", "0e:00:00:00:00:01:02:03"}[rng.IntN(8)]
			return hostileWrite{"bad MAC " + mac, subnetKey(), value("198.18.0.9", mac)}
		},
		func() hostileWrite {
			nonce++
			return hostileWrite{"other VNI", subnetKey(), fmt.Sprintf(`{"PublicIP":"198.18.0.9","BackendType":"vxlan","BackendData":{"VNI":2,"VtepMAC":"0e:00:00:00:00:09"},"Hostname":"w%d"}`, nonce)}
		},
		func() hostileWrite {
			nonce++
			return hostileWrite{"other backend", subnetKey(), fmt.Sprintf(`{"PublicIP":"198.18.0.9","BackendType":"host-gw","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:09"},"Hostname":"w%d"}`, nonce)}
		},
		func() hostileWrite {
			key := []string{"junk", "10.244.1.0", "10.244.1.0-24-1", "10.244.1.0-24/x", "../../../etc-24", "10.244.1.0-２４",
				"010.244.1.0-24", "10.244.1.1-24", strings.Repeat("9", 3000), "10.244.1.0-", "-24", " 10.244.1.0-24"}[rng.IntN(12)]
			return hostileWrite{"key outside the pattern", key, value("198.18.0.9", goodMAC())}
		},
		func() hostileWrite {
			nonce++
			v := []string{"\x00\xff garbage", "null", fmt.Sprintf(`{"PublicIP":"239.1.2.3","Hostname":"w%d"}`, nonce),
				fmt.Sprintf(`{"PublicIP":"0.0.0.0","BackendType":"vxlan","Hostname":"w%d"}`, nonce)}[rng.IntN(4)]
			return hostileWrite{"garbage over own lease", own.Addr().String() + "-" + strconv.Itoa(own.Bits()), v}
		},
	}
	out := make([]hostileWrite, n)
	for i := range out {
		out[i] = gens[rng.IntN(len(gens))]()
	}
	return out
}

// metricValue is one unlabelled metric's integer value in a /metrics
// body, or -1 if it is absent.
func metricValue(body, name string) int {
	v, ok := metricText(body, name)
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

// orphanKinds are the hostile writes of a well-formed lease that does not fit
// the network config (outside Network, another SubnetLen or VNI): what a
// config change leaves behind, counted as orphaned rather than invalid, as
// `overlayd lease list` shows them.
var orphanKinds = map[string]bool{"wrong prefix length": true, "overlaps own subnet": true, "outside the network": true, "other VNI": true}

// The daemon never crashes, never programs a hostile lease, counts every
// one, and keeps programming the valid peers written between them.
func TestHostileEtcdDataIsSkippedCountedAndSurvived(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	var ln net.Listener
	if err := lab.Do(h1.host.NS, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	h1.cfg.HealthListener = ln
	client := nsHTTPClient(h1.host.NS)
	// Pin h1's subnet (an old subnet.env is reused when free) away from
	// the hostile writes' 10.244.100-199 and the valid peers' 10.244.200+:
	// a random pick there once made the test write a "peer" over h1's own
	// lease and wait for a route that can never be.
	pinned := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.50.0/24"), 1450, true)
	if err := os.MkdirAll(filepath.Dir(h1.cfg.SubnetFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := subnet.WriteEnv(h1.cfg.SubnetFile, pinned); err != nil {
		t.Fatal(err)
	}
	h1.start(t)
	// The old subnet.env is there before the daemon runs: wait until the
	// daemon holds its lease and is ready, or the hostile writes would race
	// its claim (garbage over the pinned key made it pick another subnet).
	waitReady := func(what string) {
		testenv.Eventually(t, testenv.Slack, what, func() error {
			if code, body := get(t, client, "http://"+ln.Addr().String()+"/readyz"); code != 200 {
				return fmt.Errorf("%d %s", code, body)
			}
			return nil
		})
	}
	waitReady("h1 ready")
	own := h1.env(t).Lease()
	if own != pinned.Lease() {
		t.Fatalf("h1 took %s, not the subnet of its old subnet.env %s", own, pinned.Lease())
	}
	cli := c.reg.Client()

	hostileTotal, ownGarbage := 0, 0
	// The keys whose last write was invalid or orphaned: what the gauges
	// must show once the daemon has caught up. (Garbage over our own key is
	// not among them: the manager restores the lease at once.)
	invalid := map[string]bool{}
	orphans := map[string]bool{}
	valid := map[netip.Prefix]bool{}
	for _, seed := range []uint64{1, 2, 3} {
		rng := rand.New(rand.NewPCG(seed, 42))
		writes := hostileWrites(rng, 60, own)
		kinds := map[string]int{}
		for i, w := range writes {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
			_, err := cli.Put(ctx, c.reg.Keys.SubnetsPrefix()+w.key, w.value)
			cancel()
			if err != nil {
				t.Fatalf("seed %d: write %d (%s): %v", seed, i, w.kind, err)
			}
			if orphanKinds[w.kind] {
				orphans[w.key] = true
				delete(invalid, w.key)
			} else {
				delete(orphans, w.key) // an invalid value replaces an orphaned one
				ownKey := w.key == own.Addr().String()+"-"+strconv.Itoa(own.Bits())
				invalid[w.key] = !ownKey
				if ownKey {
					ownGarbage++
				}
				hostileTotal++
			}
			kinds[strings.Fields(w.kind)[0]]++
			if i%10 == 9 { // a valid peer now and then, between the hostile writes
				p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(200 + len(valid)), 0}), 24)
				v := fmt.Sprintf(`{"PublicIP":"198.18.0.%d","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:01:%02x"}}`, 10+len(valid), len(valid))
				ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(10*time.Second))
				if _, err := cli.Put(ctx, c.reg.Keys.LeaseKey(subnet.Subnets{IPv4: p}), v); err != nil {
					t.Fatal(err)
				}
				cancel()
				valid[p] = true
			}
		}
		t.Logf("seed %d: %d hostile writes by kind %v", seed, len(writes), kinds)
		// Every hostile write is judged once valid peers written after it
		// are programmed and the gauges show the keys left bad. The counter
		// counts each invalid value a key takes, so every hostile write,
		// but for two races the product rightly does not hide: garbage over
		// our own key may repeat the previous garbage's value before the
		// lease manager has restored the lease in between (one change, not
		// two), and a re-established watch re-lists, skipping values
		// overwritten meanwhile.
		// No timer in the way, but 60 writes to judge, some of them 100 KB
		// or 5,000 levels deep, under the race detector on a busy machine.
		wantInvalid := 0
		for _, bad := range invalid {
			if bad {
				wantInvalid++
			}
		}
		testenv.Eventually(t, 3*testenv.Slack, fmt.Sprintf("seed %d: valid peers programmed, %d keys invalid and %d orphaned, %d rejections counted", seed, wantInvalid, len(orphans), hostileTotal), func() error {
			routes := h1.routes(t)
			for p := range valid {
				if !routes[p] {
					return fmt.Errorf("valid peer %s not programmed", p)
				}
			}
			_, body := get(t, client, "http://"+ln.Addr().String()+"/metrics")
			gotInvalid, orphaned := metricValue(body, "overlay_leases_invalid"), metricValue(body, "overlay_leases_orphaned")
			total, restarts := metricValue(body, "overlay_leases_invalid_total"), metricValue(body, "overlay_watch_restarts_total")
			lowest := hostileTotal - ownGarbage
			if restarts > 0 {
				lowest = wantInvalid
			}
			if gotInvalid != wantInvalid || orphaned != len(orphans) || total < lowest || total > hostileTotal {
				return fmt.Errorf("invalid %d, orphaned %d, invalid_total %d, watch restarts %d", gotInvalid, orphaned, total, restarts)
			}
			return nil
		})
		routes := h1.routes(t)
		for p := range routes {
			if !valid[p] {
				t.Fatalf("seed %d: programmed %s, which only a hostile write named", seed, p)
			}
		}
		select {
		case err := <-h1.done:
			t.Fatalf("seed %d: the daemon exited: %v", seed, err)
		default:
		}
		// Garbage over our own lease makes it not ready until the lease is
		// restored (at once): ready again, then.
		waitReady(fmt.Sprintf("seed %d: ready after hostile writes", seed))
	}
	// Our own lease survives every garbage write: it is restored.
	// The manager restores it within one retry interval (1 s).
	waitFor(t, time.Second+testenv.Slack, "the own lease to be restored", func() bool {
		l, err := c.reg.Get(context.Background(), subnet.Subnets{IPv4: own})
		return err == nil && l.Attrs.NodeID == "h1" && !l.Reserved
	})
}
