//go:build unix

package runtime

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user and system) this process has used: for WithProcessCPU.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
