// Package demo is the model and data of fanin's demo job: a small MLP learning a seeded synthetic classification task.
//
// Everything here is pure computation: no I/O, no goroutines, no clocks. Data, initial parameters
// and gradients are functions of their seeds and arguments only, and are meant to be bit-identical
// on every platform: random numbers come from explicitly seeded PCG streams and are turned into
// floats with integer arithmetic, exp and log are computed here rather than by package math (whose
// assembly versions differ between architectures), and every product that is added to something is
// rounded explicitly so that compilers targeting FMA hardware cannot fuse it.
package demo
