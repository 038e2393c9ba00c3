#!/usr/bin/env bash
# Print the directory holding kube-apiserver, kube-controller-manager (Kubernetes v1.36.3) and etcd
# (v3.6.8, the version that Kubernetes release pins) built from the tools module tools/kube, building
# them only when the cached ones are missing. The Kubernetes pool driver's tests
# (autoscaler/kube_test.go) run them: FANIN_KUBE=$(scripts/kube.sh) go test ./autoscaler/
#
# The binaries are cached outside the repository, in ${FANIN_CACHE:-$HOME/.cache/fanin}/kube-<version>,
# because the cold build takes about 10 minutes on two cores (see docs/KUBERNETES.md). Progress goes
# to stderr; stdout is the directory alone. FANIN_KUBE, when set to a directory that holds the three
# binaries, is used as is.
set -euo pipefail

version=v1.36.3
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FANIN_CACHE:-$HOME/.cache/fanin}"
dir="$cache/kube-$version"
bins="kube-apiserver kube-controller-manager etcd"

complete() {
  for b in $bins; do [ -x "$1/$b" ] || return 1; done
}

if [ -n "${FANIN_KUBE:-}" ] && complete "$FANIN_KUBE"; then
  echo "$FANIN_KUBE"
  exit 0
fi
if complete "$dir"; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
# One build at a time: a second caller waits for the first and reuses its binaries.
exec 9>"$cache/kube-$version.lock"
flock 9
if complete "$dir"; then
  echo "$dir"
  exit 0
fi

echo "building kube-apiserver, kube-controller-manager and etcd ($version) into $dir (cached afterwards)" >&2
start=$(date +%s)
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
# go.sum in tools/kube pins every module. One go build for the three shares the compiled packages.
(cd "$root/tools/kube" &&
  GOFLAGS=-mod=readonly nice -n 10 \
    go build -trimpath -ldflags "-s -w" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      go.etcd.io/etcd/server/v3) >&2
# go build names a module-root main package after its path without the major version ("server").
mv "$tmp/server" "$tmp/etcd"
rm -rf "$dir"
mv "$tmp" "$dir"
echo "built kube $version in $(($(date +%s) - start))s" >&2
echo "$dir"
