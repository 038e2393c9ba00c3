// Package wasmfn runs user-defined aggregation functions compiled to WebAssembly: it checks a
// module against fanin's function ABI, compiles it once per engine, and gives a functions.Func
// that runs it sandboxed (module size, memory pages and time per call bounded; no files, clocks,
// randomness or network), so that the reference and every runtime compute the same bits.
package wasmfn
