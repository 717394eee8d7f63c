#!/bin/sh
# Installs what the Kubernetes lab (test/kube) runs beside the components
# `make kube` builds: Debian's containerd (and its shim) and runc, and
# iptables and nft (kube-proxy runs them in its iptables and nftables
# modes). No service is started: the lab runs its own containerd on every
# node, inside the node's namespaces.
set -eu

need=""
for pkg in containerd runc iptables nftables; do
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
		need="$need $pkg"
	fi
done
if [ -z "$need" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "test/kube: missing$need; run as root to install them" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
	echo "test/kube: missing$need and no apt-get to install them; install them by hand" >&2
	exit 1
fi
echo "test/kube: installing$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends $need
