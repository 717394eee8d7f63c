#!/bin/sh
# apt-install.sh WHO PACKAGE...: installs the Debian packages a suite
# needs (WHO names the suite in messages) when any is missing. Used by
# test/runtime/install-deps.sh and test/kube/install-deps.sh. Without
# root it only says what is missing (the suites need root as well: they
# skip, and fail under CI=true); without apt it fails.
set -eu

who=$1
shift
need=""
for pkg in "$@"; do
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
		need="$need $pkg"
	fi
done
if [ -z "$need" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "$who: missing$need; run as root to install them" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
	echo "$who: missing$need and no apt-get to install them; install them by hand" >&2
	exit 1
fi
echo "$who: installing$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# --no-install-recommends: only what is named (no netavark, slirp4netns or
# CNI plugin package: the suites point the runtimes at the project's
# plugins only).
apt-get install -y --no-install-recommends $need
