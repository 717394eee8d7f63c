#!/bin/sh
# Installs what the runtime end-to-end suite (test/runtime) drives: podman
# (CNI backend), runc, containerd (its CRI plugin) and a static busybox for
# the test image. Debian/Ubuntu packages through apt; nothing is pulled from
# a container registry. No service is started: the suite runs its own
# podman and containerd processes inside lab namespaces.
set -eu

need=""
for pkg in podman runc containerd busybox-static; do
	# busybox-static, not busybox: the test image has no libc.
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
		need="$need $pkg"
	fi
done
if [ -z "$need" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	# The suite needs root as well: it skips (fails under CI=true).
	echo "test/runtime: missing$need; run as root to install them" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
	echo "test/runtime: missing$need and no apt-get to install them; install them by hand" >&2
	exit 1
fi
echo "test/runtime: installing$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# --no-install-recommends: no netavark, slirp4netns or CNI plugin package;
# the suite points podman and containerd at the project's plugins only.
apt-get install -y --no-install-recommends $need
