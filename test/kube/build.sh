#!/usr/bin/env bash
# make kube: builds the Kubernetes components the lab runs from the release
# pinned in components/go.mod, into a cache keyed by that version, and links
# them into bin/kube. A binary already in the cache is not built again, so a
# second run builds nothing. A cold build of all seven takes ~20-30 minutes
# and ~2.7 GB of memory at its peak on 2 cores (Documentation/kubernetes.md).
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

build() { # name package
  local name=$1 pkg=$2
  if [ ! -x "$cache/$name" ]; then
    local start=$SECONDS
    echo "kube: building $name $version"
    (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$cache/$name.tmp" "$pkg")
    mv "$cache/$name.tmp" "$cache/$name"
    echo "kube: built $name in $((SECONDS - start)) s"
  fi
  ln -sf "$cache/$name" "$out/$name"
}

build etcd ./cmd/etcd
for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl; do
  build "$name" "k8s.io/kubernetes/cmd/$name"
done
echo "kube: $version (etcd $etcd) in $out"
