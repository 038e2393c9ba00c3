module github.com/fanin-ml/fanin/tools/jaeger

go 1.26.8

// The Jaeger release that scripts/jaeger.sh builds, trimmed by the files under slim/ (see
// slim/README.md). Only the module itself is pinned here: its own go.mod and go.sum pin the rest.
require github.com/jaegertracing/jaeger v1.76.0
