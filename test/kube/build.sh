#!/usr/bin/env bash
# make kube: builds the Kubernetes components the lab runs from the release
# pinned in components/go.mod, into a cache keyed by that version, and links
# them into bin/kube. A binary already in the cache is not built again, so a
# second run builds nothing. A cold build of all seven takes 30-45 minutes
# on 2 busy cores (Documentation/kubernetes.md has the figures).
#   KUBE_CACHE  the cache (default ~/.cache/overlay-kube)
#   KUBE_BIN    where the links go (default bin/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mod=$here/components
version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
etcd=$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[0-9.]*\)$/\1/p' "$mod/go.mod")
[ -n "$version" ] && [ -n "$etcd" ] || { echo "kube: no k8s.io/kubernetes or etcd version in $mod/go.mod" >&2; exit 1; }
cache=${KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/overlay-kube}/$version-etcd-$etcd
out=${KUBE_BIN:-$root/bin/kube}
mkdir -p "$cache" "$out"

# Every component reports the release, not v0.0.0-master.
minor=${version#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

# One `go build` for every component missing from the cache: one package
# graph, so the shared packages are loaded once, the commands' own
# packages compile while another command links (a link keeps one core
# busy), and no build waits for the previous one's tail. (Seven separate
# builds, measured on a busy 2-core machine: 46 minutes.)
names=(etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
missing=() pkgs=()
for name in "${names[@]}"; do
  if [ ! -x "$cache/$name" ]; then
    missing+=("$name")
    if [ "$name" = etcd ]; then pkgs+=(./cmd/etcd); else pkgs+=("k8s.io/kubernetes/cmd/$name"); fi
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  start=$SECONDS
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "kube: building ${missing[*]} ($version, etcd $etcd) in one go build"
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
  for name in "${missing[@]}"; do
    [ -x "$tmp/$name" ] || { echo "kube: go build wrote no $name" >&2; exit 1; }
    mv "$tmp/$name" "$cache/$name"
  done
  echo "kube: built ${missing[*]} in $((SECONDS - start)) s"
fi
for name in "${names[@]}"; do
  ln -sf "$cache/$name" "$out/$name"
done
echo "kube: $version (etcd $etcd) in $out"
