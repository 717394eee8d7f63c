package delegate

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// Error codes of overlay-cni's own (the CNI spec reserves 0-99). The spec
// codes used are types.ErrInvalidEnvironmentVariables (4) for a bad container
// ID or interface name, types.ErrIOFailure (5) for cache I/O,
// types.ErrInvalidNetworkConfig (7) for a bad network configuration,
// types.ErrTryAgainLater (11) when subnet.env is not there yet and
// types.ErrPluginNotAvailable (50) from STATUS.
const (
	// CodeNoCache: CHECK found no cached delegate configuration for the
	// attachment (ADD never ran, or the cache was removed).
	CodeNoCache uint = 100
	// CodeLeaseChanged: CHECK found that the host's lease in subnet.env is
	// not the lease the attachment was created from; the pod's address no
	// longer routes and the pod must be recreated.
	CodeLeaseChanged uint = 101
	// CodeCacheCorrupt: a cached delegate configuration cannot be parsed.
	CodeCacheCorrupt uint = 102
	// CodeDelegateFailed: the delegate plugin could not be found or run, or
	// failed without a CNI error of its own.
	CodeDelegateFailed uint = 103
	// CodeGCIncomplete: GC could not remove every stale resource; the
	// details list each failure and the next GC retries them.
	CodeGCIncomplete uint = 104
	// CodeAlreadyAttached: ADD of an attachment that exists (its cache
	// entry, or the interface in the container's namespace); nothing was
	// changed.
	CodeAlreadyAttached uint = 105
)

// cniError builds the *types.Error every verb returns. msg says what failed
// and what to do; the underlying error, if any, goes into the details.
func cniError(code uint, cause error, format string, args ...any) *types.Error {
	details := ""
	if cause != nil {
		details = cause.Error()
	}
	return types.NewError(code, fmt.Sprintf(format, args...), details)
}

// delegateError turns an error of the delegate plugin into ours: a CNI error
// of the delegate keeps its code (a runtime may act on it, e.g. 11), anything
// else (plugin not found, exec failure, a result that cannot be decoded)
// becomes CodeDelegateFailed.
func delegateError(verb, plugin string, err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return types.NewError(te.Code, fmt.Sprintf("delegate %s %s failed: %s", plugin, verb, te.Msg), te.Details)
	}
	if errors.Is(err, errUnusableResult) {
		return cniError(CodeDelegateFailed, err,
			"delegate %s %s printed a result overlay-cni cannot use: check the %q plugin's version (or fix delegate.type)", plugin, verb, plugin)
	}
	return cniError(CodeDelegateFailed, err,
		"delegate %s %s failed to run: check that the %q plugin is installed in CNI_PATH (or fix delegate.type)", plugin, verb, plugin)
}
