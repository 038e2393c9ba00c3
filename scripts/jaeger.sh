#!/usr/bin/env bash
# Print the path of a Jaeger v2 binary (jaegertracing/jaeger v1.76.0, cmd/jaeger) built from the
# tools module tools/jaeger, building it only when the cached binary is missing.
#
# The binary is cached outside the repository, in ${FANIN_CACHE:-$HOME/.cache/fanin}, because the
# build takes 15-25 minutes on two cores. Progress goes to stderr; stdout is the path alone, so
#   JAEGER=$(scripts/jaeger.sh)
# works. FANIN_JAEGER, when set to an existing file, is used as is.
set -euo pipefail

version=v1.76.0
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FANIN_CACHE:-$HOME/.cache/fanin}"
bin="$cache/jaeger-$version"

if [ -n "${FANIN_JAEGER:-}" ] && [ -x "$FANIN_JAEGER" ]; then
  echo "$FANIN_JAEGER"
  exit 0
fi
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# One build at a time: a second caller waits for the first and reuses its binary.
exec 9>"$cache/jaeger-$version.lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

echo "building jaeger $version into $bin (15-25 min on 2 cores; cached afterwards)" >&2
start=$(date +%s)
# Downloads first, retried (as scripts/kube.sh does), so that a dropped connection to the module
# proxy costs a retry and not the build.
for try in 1 2 3 4 5; do
  if (cd "$root/tools/jaeger" && GOSUMDB=off GOFLAGS=-mod=readonly go mod download) >&2; then break; fi
  [ "$try" = 5 ] && { echo "go mod download failed 5 times" >&2; exit 1; }
  echo "go mod download failed (try $try), retrying in $((try * 5))s" >&2
  sleep $((try * 5))
done
tmp="$bin.tmp.$$"
# go.sum in tools/jaeger pins every module; the checksum database refuses some of
# opentelemetry-collector-contrib's lookups, so it is not consulted (go.sum still is).
# Without optimisation or inlining (-N -l): the tests send Jaeger a few thousand spans, and the
# compile takes about a fifth less CPU (measured on k8s.io/api: 81 against 101 CPU-seconds).
(cd "$root/tools/jaeger" &&
  GOSUMDB=off GOFLAGS=-mod=readonly nice -n 10 \
    go build -trimpath -gcflags "all=-N -l" -ldflags "-s -w" -o "$tmp" github.com/jaegertracing/jaeger/cmd/jaeger) >&2
mv "$tmp" "$bin"
echo "built jaeger $version in $(($(date +%s) - start))s" >&2
echo "$bin"
