//go:build !linux

package autoscaler

import "syscall"

// deathSignal: only Linux can tie a child's life to its parent's; elsewhere a driver's Dir is what
// stops runtimes a dead driver left.
func deathSignal() *syscall.SysProcAttr { return nil }
