package subnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// ErrOutOfSubnets means every subnet between SubnetMin and SubnetMax is held.
var ErrOutOfSubnets = errors.New("out of subnets")

// Count is the number of subnets between SubnetMin and SubnetMax.
func (c *Config) Count() int {
	return int((addrToUint(c.SubnetMax)-addrToUint(c.SubnetMin))/c.subnetSize()) + 1
}

// SubnetAt returns the i-th subnet counting from SubnetMin.
func (c *Config) SubnetAt(i int) netip.Prefix {
	return netip.PrefixFrom(addrFromUint(addrToUint(c.SubnetMin)+uint32(i)*c.subnetSize()), c.SubnetLen)
}

// PickFree chooses a random subnet between SubnetMin and SubnetMax that is not
// in taken. Random rather than first-free, so hosts racing for a subnet
// rarely collide. It returns ErrOutOfSubnets when none is free.
func (c *Config) PickFree(taken map[netip.Prefix]bool, rng *rand.Rand) (netip.Prefix, error) {
	n := c.Count()
	used := 0
	for p := range taken {
		if c.InRange(p) {
			used++
		}
	}
	if used >= n {
		return netip.Prefix{}, fmt.Errorf("%w: all %d subnets /%d between %s and %s are leased; widen Network or the SubnetMin/SubnetMax range, or revoke stale leases", ErrOutOfSubnets, n, c.SubnetLen, c.SubnetMin, c.SubnetMax)
	}
	// A few random probes find a free subnet quickly unless the pool is
	// nearly full; then a scan from a random start is certain to.
	for range 16 {
		if p := c.SubnetAt(rng.IntN(n)); !taken[p] {
			return p, nil
		}
	}
	start := rng.IntN(n)
	for i := range n {
		if p := c.SubnetAt((start + i) % n); !taken[p] {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: no free subnet found among %d", ErrOutOfSubnets, n) // not reached: a free one was counted
}
