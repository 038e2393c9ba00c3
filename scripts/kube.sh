#!/usr/bin/env bash
# Print the directory holding Kubernetes v1.36.3 binaries and etcd (v3.6.8, the version that
# Kubernetes release pins) built from the tools module tools/kube, building only the ones missing
# from the cache.
#
#   scripts/kube.sh          kube-apiserver, kube-controller-manager, etcd: the control plane that
#                            the Kubernetes pool driver's tests (autoscaler/kubedriver) run:
#                            FANIN_KUBE=$(scripts/kube.sh) go test ./autoscaler/kubedriver/
#   scripts/kube.sh --node   the same plus kubelet, kube-scheduler, kube-proxy, kubectl, CoreDNS
#                            (tools/kube/coredns) and a pod sandbox's process (tools/kube/pause,
#                            static): a whole node, for scripts/kube-node.sh
#
# The binaries are cached outside the repository, in ${FANIN_CACHE:-$HOME/.cache/fanin}/kube-<version>,
# because the cold build takes long on two cores (see docs/lab/kubernetes.md). The missing binaries are
# built by one go build, so they share their compiled packages; a later --node build reuses Go's
# build cache for the packages the control plane already compiled. Module downloads are retried:
# the Go module proxy drops one now and then. Progress goes to stderr; stdout is the directory alone.
# FANIN_KUBE, when set to a directory that holds the binaries asked for, is used as is.
set -euo pipefail

version=v1.36.3
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FANIN_CACHE:-$HOME/.cache/fanin}"
dir="$cache/kube-$version"

# binary name -> package in tools/kube's tool block
declare -A pkg=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [etcd]=go.etcd.io/etcd/server/v3
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [coredns]=./coredns
  [pause]=./pause
)
bins="kube-apiserver kube-controller-manager etcd"
case "${1:-}" in
  "") ;;
  --node) bins="$bins kubelet kube-scheduler kube-proxy kubectl coredns pause" ;;
  *) echo "usage: scripts/kube.sh [--node]" >&2; exit 2 ;;
esac

missing() {
  local m=""
  for b in $bins; do [ -x "$1/$b" ] || m="$m $b"; done
  echo "$m"
}

if [ -n "${FANIN_KUBE:-}" ] && [ -z "$(missing "$FANIN_KUBE")" ]; then
  echo "$FANIN_KUBE"
  exit 0
fi
if [ -z "$(missing "$dir")" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
# One build at a time: a second caller waits for the first and reuses its binaries.
exec 9>"$cache/kube-$version.lock"
flock 9
need="$(missing "$dir")"
if [ -z "$need" ]; then
  echo "$dir"
  exit 0
fi

echo "building$need ($version) into $dir (cached afterwards)" >&2
start=$(date +%s)
# go.sum in tools/kube pins every module. Downloads first, retried, so that a dropped connection
# costs a retry and not the build.
for try in 1 2 3 4 5; do
  if (cd "$root/tools/kube" && GOFLAGS=-mod=readonly go mod download) >&2; then break; fi
  [ "$try" = 5 ] && { echo "go mod download failed 5 times" >&2; exit 1; }
  echo "go mod download failed (try $try), retrying in $((try * 5))s" >&2
  sleep $((try * 5))
done
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
pkgs=""
for b in $need; do pkgs="$pkgs ${pkg[$b]}"; done
# Compiled without optimisations or inlining (-N -l): the compiler then spends about 30% less CPU
# (kube-scheduler from an empty build cache: 335 CPU-s against 477 here), which is what a fresh CI
# run waits for, and these binaries serve one test node, not a production cluster. FANIN_KUBE_GCFLAGS
# overrides it (e.g. empty, for optimised binaries).
# shellcheck disable=SC2086 # one word per package
(cd "$root/tools/kube" &&
  GOFLAGS=-mod=readonly nice -n "${FANIN_NICE:-10}" \
    go build -trimpath -ldflags "-s -w" -gcflags="all=${FANIN_KUBE_GCFLAGS--N -l}" -o "$tmp/" $pkgs) >&2
# go build names a module-root main package after its path without the major version ("server").
[ -e "$tmp/server" ] && mv "$tmp/server" "$tmp/etcd"
mkdir -p "$dir"
for b in $need; do mv "$tmp/$b" "$dir/$b"; done
echo "built$need in $(($(date +%s) - start))s" >&2
echo "$dir"
