#!/usr/bin/env bash
# Writes go.mod for the Kubernetes components at one k8s.io/kubernetes
# release: k8s.io/kubernetes replaces each k8s.io staging module with
# ./staging/..., which its module zip lacks, so the wrapper replaces them
# with their published v0.X.Y releases (the list changes between releases:
# it is read from the release's own go.mod). Then: go mod tidy.
# Usage: ./gen-go-mod.sh 1.37.2 [etcd-server-version]
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: $0 KUBERNETES_VERSION [ETCD_VERSION]}
etcd=${2:-v3.7.0}
mod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$mod" ] || { echo "gen-go-mod: no go.mod for k8s.io/kubernetes@v$version" >&2; exit 1; }
staging=v0.${version#1.}
{
  echo "// The Kubernetes components the lab runs (make kube), built from one pinned"
  echo "// k8s.io/kubernetes release. A module of its own so the product's go.mod"
  echo "// gains no Kubernetes dependency. Written by ./gen-go-mod.sh $version."
  echo "module github.com/overlaynet/overlay/test/kube/components"
  echo
  grep '^go ' "$mod"
  echo
  grep '^godebug' "$mod" || true
  echo
  echo "require ("
  echo "	go.etcd.io/etcd/server/v3 $etcd"
  echo "	k8s.io/kubernetes v$version"
  echo ")"
  echo
  echo "replace ("
  # sample-* are examples, not required by any command, and unpublished.
  grep '=> ./staging/' "$mod" | awk '{print $1}' | grep -v '^k8s.io/sample-' |
    awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > go.mod
