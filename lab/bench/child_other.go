//go:build !linux

package bench

import "syscall"

// dieWithBench: elsewhere a child outlives a bench that is killed.
func dieWithBench() *syscall.SysProcAttr { return nil }
