package lab

import "github.com/vishvananda/netns"

// NewNamedNS creates a named network namespace (visible to `ip netns`)
// without moving the caller. Name it with RunPrefix so a crashed run's
// leftovers are found and removed by RemoveStale.
func NewNamedNS(name string) (netns.NsHandle, error) { return newNamedNS(name) }

// RunPrefix is the namespace name prefix of this process's run tagged tag,
// "ovl<pid>-<tag>-".
func RunPrefix(tag string) string { return runPrefix(tag) }
