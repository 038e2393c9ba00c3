#!/usr/bin/env bash
# Print the path of a Jaeger v2 binary (jaegertracing/jaeger v1.76.0, cmd/jaeger, trimmed to the
# OTLP-in, memory-storage, query-API pipeline by tools/jaeger/slim: see its README.md), building it
# only when the cached binary is missing.
#
# The binary is cached outside the repository, in ${FANIN_CACHE:-$HOME/.cache/fanin}; its build
# takes 1.5-3 minutes on two cores. Progress goes to stderr; stdout is the path alone, so
#   JAEGER=$(scripts/jaeger.sh)
# works. FANIN_JAEGER, when set to an existing file, is used as is. Without --config the binary
# listens on localhost: OTLP on 4317 (gRPC) and 4318 (HTTP), the query API and UI on 16686.
set -euo pipefail

version=v1.76.0
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${FANIN_CACHE:-$HOME/.cache/fanin}"
bin="$cache/jaeger-$version-slim"

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

echo "building jaeger $version into $bin (1.5-3 min on 2 cores; cached afterwards)" >&2
start=$(date +%s)
# retry N CMD... runs CMD until it succeeds, N times at most: the Go module proxy drops a download
# now and then, and a dropped connection should cost a retry, not the build.
retry() {
  local n=$1 try
  shift
  for ((try = 1; ; try++)); do
    if "$@"; then return 0; fi
    [ "$try" -ge "$n" ] && { echo "failed $n times: $*" >&2; return 1; }
    echo "failed (try $try), retrying in $((try * 5))s: $*" >&2
    sleep $((try * 5))
  done
}
# Jaeger's module, checked against tools/jaeger/go.sum, copied where it can be edited.
moddir() { (cd "$root/tools/jaeger" && GOFLAGS=-mod=readonly go mod download -json github.com/jaegertracing/jaeger) | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
retry 5 moddir >/dev/null
dir=$(moddir)
src=$(mktemp -d "$cache/jaeger-src.XXXXXX")
trap 'rm -rf "$src"' EXIT
cp -R "$dir/." "$src"
chmod -R u+w "$src"
cp -R "$root/tools/jaeger/slim/cmd" "$src/"
# cmd/query/app/flags.go: drop BuildQueryServiceOptions and its InitArchiveStorageFn (the v1
# archive storage, which Jaeger v2's query extension does not call) and the four imports only they
# use; the v1 storage factory among them links every v1 backend.
flags="$src/cmd/query/app/flags.go"
sed -i -e '/^type InitArchiveStorageFn /d' -e '/^\/\/ BuildQueryServiceOptions /,/^}$/d' \
  -e '/"github.com\/jaegertracing\/jaeger\/internal\/storage\/v1\/factory"$/d' \
  -e '/"github.com\/jaegertracing\/jaeger\/internal\/storage\/v2\/v1adapter"$/d' \
  -e '/"github.com\/jaegertracing\/jaeger\/cmd\/query\/app\/querysvc"$/d' \
  -e '/"github.com\/jaegertracing\/jaeger\/cmd\/query\/app\/querysvc\/v2\/querysvc"$/d' "$flags"
if grep -q 'BuildQueryServiceOptions\|storage/v1/factory' "$flags"; then
  echo "$flags: the edit for Jaeger $version no longer applies (see tools/jaeger/slim/README.md)" >&2
  exit 1
fi
# Jaeger's own go.mod and go.sum pin every module; `go list -deps` downloads the ones this build
# needs (about a fifth of the go.mod's), retried.
cd "$src"
export GOFLAGS=-mod=readonly
retry 5 go list -deps ./cmd/jaeger >/dev/null
tmp="$bin.tmp.$$"
# Without optimisation or inlining (-N -l): the tests send Jaeger a few thousand spans, and the
# compile takes about a fifth less CPU.
nice -n 10 go build -trimpath -gcflags "all=-N -l" -ldflags "-s -w" -o "$tmp" ./cmd/jaeger >&2
mv "$tmp" "$bin"
echo "built jaeger $version in $(($(date +%s) - start))s" >&2
echo "$bin"
