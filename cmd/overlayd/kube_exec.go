//go:build !kube

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/version"
)

// This is overlayd: it links no Kubernetes client. client-go's REST client
// and informer are a fifth of overlayd-kube's size, and their package
// inits fault in pages all over it, so every host in etcd mode would carry
// ~4 MB more resident memory for a mode it does not run (issue 33,
// Documentation/design.md "Two programs"). A command in kube mode is handed
// over to overlayd-kube instead.

// linkedKube is nil: no Kubernetes client here.
var linkedKube kubeClient

// handOverToKube replaces this process with overlayd-kube, found beside
// it, with the same arguments and environment: the same PID, so whatever
// supervises overlayd (kubelet, systemd) sees no change. It returns only
// if it cannot.
var handOverToKube handOver = func(environ []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--kube-subnet-mgr: find this program to run %s beside it: %w", KubeProgram, err)
	}
	path, env, err := kubeExec(self, environ)
	if err != nil {
		return err
	}
	return fmt.Errorf("--kube-subnet-mgr: run %s: %w", path, syscall.Exec(path, os.Args, env))
}

// kubeExec is what handOverToKube runs, overlayd being at self: the path
// of overlayd-kube beside it, and environ with handOverVar naming this
// build (overlayd-kube refuses to run for another).
func kubeExec(self string, environ []string) (path string, env []string, err error) {
	path = filepath.Join(filepath.Dir(self), KubeProgram)
	if err := unix.Access(path, unix.X_OK); err != nil {
		return "", nil, fmt.Errorf("--kube-subnet-mgr: kube mode runs %s, but %s: %w: install it beside %s, from the same build (make build builds both; the image has both)",
			KubeProgram, path, err, self)
	}
	return path, append(slices.Clip(environ), handOverVar+"="+version.Version), nil
}
