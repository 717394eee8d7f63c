package peerhealth

import (
	"testing"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/overlaynet/overlay/backend"
)

func echo(t testing.TB, typ icmp.Type, id, seq int) []byte {
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: probePayload}}).Marshal(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		fam  backend.Family
		raw  bool
		seq  uint16
		ok   bool
	}{
		{"datagram IPv4 echo reply", echo(t, ipv4.ICMPTypeEchoReply, 0, 7), backend.IPv4, false, 7, true},
		{"datagram IPv6 echo reply", echo(t, ipv6.ICMPTypeEchoReply, 0, 65535), backend.IPv6, false, 65535, true},
		{"raw IPv4 reply of this prober", echo(t, ipv4.ICMPTypeEchoReply, 4242, 9), backend.IPv4, true, 9, true},
		{"raw IPv6 reply (no header)", echo(t, ipv6.ICMPTypeEchoReply, 4242, 3), backend.IPv6, true, 3, true},
		{"another program's reply on a raw socket", echo(t, ipv4.ICMPTypeEchoReply, 1, 9), backend.IPv4, true, 0, false},
		{"an IPv6 reply read as IPv4", echo(t, ipv6.ICMPTypeEchoReply, 0, 9), backend.IPv4, false, 0, false},
		{"an echo request", echo(t, ipv4.ICMPTypeEcho, 0, 9), backend.IPv4, false, 0, false},
		{"a destination unreachable", []byte{3, 1, 0, 0, 0, 0, 0, 0}, backend.IPv4, false, 0, false},
		{"empty", nil, backend.IPv4, true, 0, false},
		{"truncated reply", echo(t, ipv4.ICMPTypeEchoReply, 0, 9)[:5], backend.IPv4, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, ok := parseReply(tc.b, tc.fam, tc.raw, 4242)
			if seq != tc.seq || ok != tc.ok {
				t.Fatalf("parseReply = %d, %v; want %d, %v", seq, ok, tc.seq, tc.ok)
			}
		})
	}
}

// Whatever arrives on the socket, parsing it never panics, and what it
// accepts is an echo reply: its type byte says so.
func FuzzParseReply(f *testing.F) {
	f.Add(echo(f, ipv4.ICMPTypeEchoReply, 0, 7), uint8(4), false)
	f.Add(echo(f, ipv4.ICMPTypeEchoReply, 4242, 9), uint8(4), true)
	f.Add(echo(f, ipv6.ICMPTypeEchoReply, 4242, 3), uint8(6), true)
	f.Add([]byte{0x4f, 0, 0}, uint8(4), true)
	f.Fuzz(func(t *testing.T, b []byte, famByte uint8, raw bool) {
		fam := backend.IPv4
		if famByte%2 == 0 {
			fam = backend.IPv6
		}
		_, ok := parseReply(b, fam, raw, 4242)
		if !ok {
			return
		}
		msg := b
		want := byte(ipv4.ICMPTypeEchoReply)
		if fam == backend.IPv6 {
			want = byte(ipv6.ICMPTypeEchoReply)
		}
		if len(msg) < 8 || msg[0] != want {
			t.Fatalf("accepted %x (%s, raw %v), which is no echo reply", b, fam, raw)
		}
	})
}
