package e2e

import "syscall"

// orphanGuard makes a process the tests start die with the test binary. A test binary killed by
// its -timeout (or by a developer's ^C) runs no cleanup, and the servers, gateways and runtimes it
// started would otherwise go on, orphaned, taking ports and cores from the next run.
//
// The kernel sends the signal when the thread that started the process exits; the Go runtime keeps
// its threads for the life of the process (no test here locks a goroutine to a thread and exits it).
func orphanGuard() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
