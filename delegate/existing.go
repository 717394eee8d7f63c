package delegate

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// refuseExisting refuses an ADD of an attachment that already exists: its
// cache entry is there (an earlier ADD that was never deleted), or the
// container's namespace already has the interface. The CNI spec makes
// such an ADD an error, and bridge fails it anyway; refusing before
// anything is cached or delegated means the rollback of the failed ADD
// cannot delete the existing attachment's interface, address or entry.
// Two ADDs of one attachment at once both pass this check; the cache
// entry, created exclusively, then lets only one of them go on.
func (p *Plugin) refuseExisting(cache Cache, att Attachment, args *skel.CmdArgs) error {
	path, err := cache.Path(att)
	if err != nil { // loadAttachment validated att: cannot happen
		return cniError(types.ErrInvalidEnvironmentVariables, err, "invalid attachment %s", att)
	}
	if _, err := os.Lstat(path); err == nil {
		return alreadyAttached(cache, att)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return cniError(types.ErrIOFailure, err, "cannot look for the cache entry of %s in %s", att, cache.Dir)
	}
	exists, err := p.invoker.InterfaceExists(args.Netns, args.IfName)
	if err != nil {
		p.logf("cannot tell whether %s exists in %s (the delegate will): %v", args.IfName, args.Netns, err)
		return nil
	}
	if exists {
		return cniError(CodeAlreadyAttached, nil,
			"interface %s already exists in network namespace %s: %s is attached already, or CNI_IFNAME is taken; DEL it first or use another CNI_IFNAME", args.IfName, args.Netns, att)
	}
	return nil
}

// alreadyAttached is the error of an ADD whose cache entry exists.
func alreadyAttached(cache Cache, att Attachment) *types.Error {
	path, _ := cache.Path(att)
	return cniError(CodeAlreadyAttached, nil,
		"%s is already attached (cache entry %s): the runtime must DEL it before adding it again", att, path)
}

// InterfaceExists reports whether the network namespace at netnsPath has
// an interface named ifname. It looks from a thread of its own switched
// into that namespace; the thread is never switched back but ends with its
// goroutine (LockOSThread without Unlock), so no other code ever runs in
// the container's namespace.
func (e *ExecInvoker) InterfaceExists(netnsPath, ifname string) (bool, error) {
	type answer struct {
		exists bool
		err    error
	}
	ch := make(chan answer, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread exits with this goroutine
		fd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			ch <- answer{err: fmt.Errorf("open %s: %w", netnsPath, err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- answer{err: fmt.Errorf("enter %s: %w", netnsPath, err)}
			return
		}
		ifs, err := net.Interfaces()
		if err != nil {
			ch <- answer{err: fmt.Errorf("list the interfaces of %s: %w", netnsPath, err)}
			return
		}
		for _, i := range ifs {
			if i.Name == ifname {
				ch <- answer{exists: true}
				return
			}
		}
		ch <- answer{}
	}()
	a := <-ch
	return a.exists, a.err
}
