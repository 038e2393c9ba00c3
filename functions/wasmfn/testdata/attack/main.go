// Command attack misbehaves on request, for the sandbox's tests: its hyper-parameter "mode"
// picks the attack; mode 0 is sum (p = g).
package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"github.com/fanin-ml/fanin/functions/guest"
)

const (
	modeSum = iota
	modeLoop
	modeGrow
	modeTrap
	modeNaN
	modeError
	modePanic
	modeSleep
	modeExit
	modeFile
	modeClock
	modeStateNaN
	modeStack
)

func init() {
	guest.Register(guest.Function{
		Doc:   "misbehaves on request",
		State: []string{"s"},
		Hyper: []guest.Hyper{{Name: "mode", Range: "[0, 20]"}},
		Apply: apply,
	})
}

var sink [][]byte

func recurse(n int) int {
	var pad [256]byte
	pad[n%256] = byte(n)
	return recurse(n+1) + int(pad[0])
}

func apply(u *guest.Update) error {
	copy(u.Params, u.Grad)
	switch int(u.Hyper.Get("mode")) {
	case modeLoop:
		for {
		}
	case modeGrow:
		for {
			sink = append(sink, make([]byte, 16<<20))
		}
	case modeTrap: // a load beyond the linear memory: a WebAssembly trap, not a Go panic
		p := (*float32)(unsafe.Pointer(uintptr(0xfffffff0)))
		u.Params[0] = *p
	case modeNaN:
		u.Params[len(u.Params)-1] = float32(math.NaN())
	case modeStateNaN:
		u.State[0][0] = math.Float32frombits(0x7f800001) // a signalling NaN
	case modeError:
		return errors.New("refusing on purpose")
	case modePanic:
		var m map[string]int
		m["x"] = 1
	case modeSleep: // the clock jumps: no wait
		time.Sleep(time.Hour)
	case modeExit:
		fmt.Println("leaving now")
		os.Exit(3)
	case modeFile:
		if _, err := os.ReadFile("/etc/passwd"); err == nil {
			return errors.New("read /etc/passwd")
		}
		if _, err := os.Create("/tmp/fanin-wasm-escape"); err == nil {
			return errors.New("created a file")
		}
	case modeClock: // the clock starts at the same instant at every call
		u.Params[0] = float32(time.Now().UnixNano() % 1e6)
	case modeStack:
		u.Params[0] = float32(recurse(0))
	}
	return nil
}

func main() {}
