package masq

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// generation returns the nftables ruleset generation of namespace ns: the
// kernel increments it with every committed transaction, in any table. Equal
// values before and after a series of dumps mean the dumps saw one
// consistent ruleset (what `nft` itself checks). github.com/google/nftables
// v0.3.0 has no call for NFT_MSG_GETGEN, so this speaks netlink directly.
func generation(ns netns.NsHandle, timeout time.Duration) (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd(ns)})
	if err != nil {
		return 0, fmt.Errorf("nftables netlink in netns %s: %w", ns, err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, fmt.Errorf("nftables netlink in netns %s: set deadline: %w", ns, err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		// struct nfgenmsg: family, version, resource id.
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("read the nftables ruleset generation in netns %s: %w", ns, err)
	}
	for _, msg := range msgs {
		if msg.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) || len(msg.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(msg.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("decode the nftables ruleset generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, fmt.Errorf("decode the nftables ruleset generation: %w", err)
		}
	}
	return 0, fmt.Errorf("read the nftables ruleset generation in netns %s: no generation in the kernel's answer", ns)
}

// nsFd is the namespace descriptor for a netlink dial into ns: 0 ("where
// the calling thread is") when the calling thread is in ns already, else
// ns's descriptor. Entering a namespace takes CAP_SYS_ADMIN, even the one a
// thread is in, and a DaemonSet pod granted NET_ADMIN alone (as
// deploy/kubernetes/overlay.yaml's) lacks it. A goroutine that has not
// locked its thread runs on threads that are all in the process's
// namespace, so the answer holds for the dials that follow on any of them.
func nsFd(ns netns.NsHandle) int {
	cur, err := netns.Get()
	if err != nil {
		return int(ns)
	}
	defer cur.Close()
	if cur.Equal(ns) {
		return 0
	}
	return int(ns)
}
