//go:build unix

package bench

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/runtime"
)

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration { return runtime.ProcessCPU() }

// childCPU is the CPU time another process has used, from /proc (Linux); 0 where unknown.
func childCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	// Fields after the name: state(0) ... utime(11) stime(12), in clock ticks (100 Hz on Linux).
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+st) * (time.Second / 100)
}
