package bench

import "syscall"

// dieWithBench makes a child process be killed when the bench dies (killed, or out of memory):
// a runtime or worker left behind would take the cores and memory of the runs after it.
func dieWithBench() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
