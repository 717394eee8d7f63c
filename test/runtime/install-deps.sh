#!/bin/sh
# Installs what the runtime end-to-end suite (test/runtime) drives: podman
# (CNI backend), runc, containerd (its CRI plugin) and a static busybox for
# the test image (busybox-static, not busybox: the image has no libc).
# Debian/Ubuntu packages through apt; nothing is pulled from a container
# registry. No service is started: the suite runs its own podman and
# containerd processes inside lab namespaces.
set -eu
exec "$(dirname "$0")/../apt-install.sh" test/runtime podman runc containerd busybox-static
