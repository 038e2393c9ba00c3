// Package guest is what an aggregation function written in Go and compiled to WebAssembly
// (GOOS=wasip1 GOARCH=wasm, -buildmode=c-shared) links to speak fanin's function ABI: the
// function registers itself with Register in an init function, and the package exports the
// entry points the runtime calls (docs/FUNCTIONS.md).
package guest
