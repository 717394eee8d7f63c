#!/bin/sh
# Installs what the Kubernetes lab (test/kube) runs beside the components
# `make kube` builds: Debian's containerd (and its shim) and runc, and
# iptables and nft (kube-proxy runs them in its iptables and nftables
# modes). No service is started: the lab runs its own containerd on every
# node, inside the node's namespaces.
set -eu
exec "$(dirname "$0")/../apt-install.sh" test/kube containerd runc iptables nftables
