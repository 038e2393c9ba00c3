package bench

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"math"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"unsafe"

	"github.com/fanin-ml/fanin/functions"
)

// littleEndian is true when float32 memory is already the wire's little-endian bytes.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// fillGradient fills g with rank's pseudo-gradient: small, finite, different for every element
// and rank, the same on every run.
func fillGradient(g []float32, rank int) {
	z := uint64(rank+1) * 0x9E3779B97F4A7C15
	for i := range g {
		z += 0x9E3779B97F4A7C15
		x := z
		x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
		x = (x ^ (x >> 27)) * 0x94D049BB133111EB
		x ^= x >> 31
		g[i] = float32(int32(uint32(x))) / math.MaxInt32 * 1e-3
	}
}

// asBytes is v's memory as bytes.
func asBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// wireBytes returns v as little-endian bytes: its own memory on a little-endian machine (as the
// SDK sends it), else an encoding into buf.
func wireBytes(v []float32, buf []byte) []byte {
	if littleEndian {
		return asBytes(v)
	}
	b := buf[:4*len(v)]
	functions.EncodeLE(b, v)
	return b
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum identifies a parameter vector: equal vectors, bit for bit, have equal checksums.
func checksum(v []float32) uint32 {
	if littleEndian {
		return crc32.Checksum(asBytes(v), castagnoli)
	}
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return crc32.Checksum(b, castagnoli)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// mib names a size in bytes as in a benchmark name: 4MiB, 256KiB.
func mib(b int) string {
	switch {
	case b%(1<<20) == 0:
		return strconv.Itoa(b>>20) + "MiB"
	case b%(1<<10) == 0:
		return strconv.Itoa(b>>10) + "KiB"
	}
	return strconv.Itoa(b) + "B"
}

// tripwire records the first failure of a baseline's moving parts, so that its ranks stop
// waiting for parameters that will never come instead of hanging.
type tripwire struct {
	once sync.Once
	ch   chan struct{} // closed by the first trip
	err  error         // written once, before ch is closed
}

func newTripwire() *tripwire { return &tripwire{ch: make(chan struct{})} }

func (t *tripwire) trip(err error) {
	t.once.Do(func() { t.err = err; close(t.ch) })
}

// done is closed once something failed.
func (t *tripwire) done() <-chan struct{} { return t.ch }

// failed is the first failure, or nil.
func (t *tripwire) failed() error {
	select {
	case <-t.ch:
		return t.err
	default:
		return nil
	}
}

// tail is the last n bytes of b, for an error that quotes a process's output.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// command runs name with args as a child of the bench: killed when ctx ends, or when the bench
// dies (dieWithBench).
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = dieWithBench()
	return cmd
}
