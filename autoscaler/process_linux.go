package autoscaler

import "syscall"

// deathSignal asks the kernel to send a runtime SIGTERM when its driver dies, however it dies: the
// runtime then checkpoints and releases its shards instead of serving on, orphaned.
func deathSignal() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
