//go:build !linux

package e2e

import "syscall"

// orphanGuard has nothing to set where the kernel has no parent-death signal.
func orphanGuard() *syscall.SysProcAttr { return nil }
