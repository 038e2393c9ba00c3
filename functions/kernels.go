package functions

import (
	"encoding/binary"
	"math"
	"strconv"
	"unsafe"

	"github.com/fanin-ml/fanin/wire"
)

// The kernels move raw little-endian float32 payloads (the wire format) into and out of float32
// vectors, without allocating. With AVX2 on amd64, AddLE, Add and SumLE run the assembly fold
// (simd_amd64.s), which reads a payload in place at any alignment. Otherwise, on a
// little-endian machine a payload's bytes are already its float32s: CopyLE and EncodeLE are a
// memmove whatever the alignment; AddLE, ScaleLE and AxpyLE reinterpret a 4-byte aligned payload in place (unsafe.Slice, after checking the address), and
// copy an unaligned one through an aligned 4 KiB buffer on the stack, which is about twice as
// fast as decoding it element by element. On a big-endian machine they decode with
// binary.LittleEndian (tested there under qemu-s390x). All paths give the same bits. Products
// are wrapped in float32(...) so that AxpyLE cannot be fused into an FMA (see the package doc).

// littleEndian is true when the machine's float32 memory layout is the wire's.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// chunk is the number of float32s an unaligned payload is copied through at a time (4 KiB).
const chunk = 1024

// asFloats returns b reinterpreted as float32s when that is the same as decoding it
// little-endian: on a little-endian machine with b 4-byte aligned. The callers have checked that
// len(b) is a multiple of 4.
func asFloats(b []byte) ([]float32, bool) {
	if !littleEndian || len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), true
}

// asBytes returns the memory of x as bytes (always valid: bytes need no alignment).
func asBytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

func checkLen(n int, src []byte) {
	if len(src) != 4*n {
		panic("functions: byte slice length " + strconv.Itoa(len(src)) + " is not 4*" + strconv.Itoa(n))
	}
}

func le(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

// The operations viaChunks performs.
const (
	opAdd = iota
	opScale
	opAxpy
)

// viaChunks performs op (Add, Scale or Axpy with w) on successive chunks of dst, with the
// float32s of the matching part of src copied to an aligned buffer on the stack: the unaligned
// path on little-endian machines. (A switch rather than a func argument, which would move the
// buffer to the heap.)
func viaChunks(dst []float32, src []byte, op int, w float32) {
	var buf [chunk]float32
	b := asBytes(buf[:])
	for len(dst) > 0 {
		n := min(len(dst), chunk)
		copy(b, src[:4*n])
		switch op {
		case opAdd:
			Add(dst[:n], buf[:n])
		case opScale:
			Scale(dst[:n], w, buf[:n])
		case opAxpy:
			Axpy(dst[:n], w, buf[:n])
		}
		dst, src = dst[n:], src[4*n:]
	}
}

// CopyLE sets dst[i] to the float32 decoded little-endian from src[4i:4i+4].
// It panics unless len(src) == 4*len(dst).
func CopyLE(dst []float32, src []byte) {
	checkLen(len(dst), src)
	if littleEndian {
		copy(asBytes(dst), src)
		return
	}
	copyLEDecode(dst, src)
}

func copyLEDecode(dst []float32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = le(src[4*i:])
	}
}

// AddLE adds the float32s decoded little-endian from src to dst: dst[i] += src[i].
// It panics unless len(src) == 4*len(dst).
func AddLE(dst []float32, src []byte) {
	checkLen(len(dst), src)
	if useSIMD && len(dst) > 0 {
		addSIMD(dst, unsafe.Pointer(&src[0]))
	} else if x, ok := asFloats(src); ok {
		Add(dst, x)
	} else if littleEndian {
		viaChunks(dst, src, opAdd, 0)
	} else {
		addLEDecode(dst, src)
	}
}

func addLEDecode(dst []float32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] += le(src[4*i:])
	}
}

// ScaleLE sets dst[i] = float32(w*src[i]), src decoded little-endian: the first rank of a
// weighted sum. It panics unless len(src) == 4*len(dst).
func ScaleLE(dst []float32, w float32, src []byte) {
	checkLen(len(dst), src)
	if useSIMD && len(dst) > 0 {
		scaleSIMD(dst, w, unsafe.Pointer(&src[0]))
	} else if x, ok := asFloats(src); ok {
		Scale(dst, w, x)
	} else if littleEndian {
		viaChunks(dst, src, opScale, w)
	} else {
		scaleLEDecode(dst, w, src)
	}
}

func scaleLEDecode(dst []float32, w float32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = float32(w * le(src[4*i:]))
	}
}

// AxpyLE adds float32(w*src[i]) to dst[i], src decoded little-endian: the later ranks of a
// weighted sum. It panics unless len(src) == 4*len(dst).
func AxpyLE(dst []float32, w float32, src []byte) {
	checkLen(len(dst), src)
	if useSIMD && len(dst) > 0 {
		axpySIMD(dst, w, unsafe.Pointer(&src[0]))
	} else if x, ok := asFloats(src); ok {
		Axpy(dst, w, x)
	} else if littleEndian {
		viaChunks(dst, src, opAxpy, w)
	} else {
		axpyLEDecode(dst, w, src)
	}
}

func axpyLEDecode(dst []float32, w float32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] += float32(w * le(src[4*i:]))
	}
}

// Add sets dst[i] += x[i]. It panics if x is shorter than dst.
func Add(dst, x []float32) {
	x = x[:len(dst)]
	if useSIMD && len(dst) > 0 {
		addSIMD(dst, unsafe.Pointer(&x[0]))
		return
	}
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d := (*[8]float32)(dst[i:])
		s := (*[8]float32)(x[i:])
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += x[i]
	}
}

// Scale sets dst[i] = float32(w*x[i]). It panics if x is shorter than dst.
func Scale(dst []float32, w float32, x []float32) {
	x = x[:len(dst)]
	if useSIMD && len(dst) > 0 {
		scaleSIMD(dst, w, unsafe.Pointer(&x[0]))
		return
	}
	for i := range dst {
		dst[i] = float32(w * x[i])
	}
}

// Axpy sets dst[i] += float32(w*x[i]). It panics if x is shorter than dst.
func Axpy(dst []float32, w float32, x []float32) {
	x = x[:len(dst)]
	if useSIMD && len(dst) > 0 {
		axpySIMD(dst, w, unsafe.Pointer(&x[0]))
		return
	}
	for i := range dst {
		dst[i] += float32(w * x[i])
	}
}

// EncodeLE writes src to dst as little-endian float32s, the inverse of CopyLE: wire.Encode of
// f32 (which tests its big-endian path). It panics unless len(dst) == 4*len(src).
func EncodeLE(dst []byte, src []float32) {
	checkLen(len(src), dst)
	wire.Encode(dst, src, wire.F32)
}

// NonFinite returns the index (in float32s) of the first NaN or ±Inf among the little-endian
// float32s in src, or -1 when all are finite. It panics unless len(src) is a multiple of 4. It is
// wire.NonFinite of an f32 payload, which tests two float32s per 64-bit word.
func NonFinite(src []byte) int {
	if len(src)%4 != 0 {
		panic("functions: byte slice length " + strconv.Itoa(len(src)) + " is not a multiple of 4")
	}
	return wire.NonFinite(src, wire.F32)
}

// sumBlock is how many elements SumLE sums at a time: 16 KiB of dst stays in the L1 cache while
// every rank is added to it.
const sumBlock = 4096

// SumLE sets dst to the sum of the little-endian float32 payloads srcs[0..N-1] in rank order:
// the same bits as CopyLE(dst, srcs[0]) followed by AddLE(dst, srcs[r]) for r = 1..N-1, faster
// when all the payloads are at hand. It works through dst in cache-sized blocks and adds up to
// four ranks per pass, dst[i] = (((dst[i] + a[i]) + b[i]) + c[i]) + d[i], which performs the same
// float32 additions in the same order as four AddLE calls. It panics unless len(srcs) >= 1 and
// every len(srcs[r]) == 4*len(dst).
func SumLE(dst []float32, srcs [][]byte) {
	if len(srcs) == 0 {
		panic("functions: SumLE of no payloads")
	}
	for _, s := range srcs {
		checkLen(len(dst), s)
	}
	sumRange(dst, srcs, 0)
}

// sumRange sets dst to the rank-order sum of the elements off..off+len(dst)-1 of srcs.
func sumRange(dst []float32, srcs [][]byte, off int) {
	if useSIMD {
		foldSIMD(dst, srcs, off)
		return
	}
	n := len(dst)
	// The fused path needs every payload as []float32; up to 64 of them are kept on the stack.
	var buf [64][]float32
	if len(srcs) <= len(buf) && n > 0 {
		xs := buf[:len(srcs)]
		aligned := true
		for r, s := range srcs {
			if xs[r], aligned = asFloats(s[4*off : 4*(off+n)]); !aligned {
				break
			}
		}
		if aligned {
			sumFloats(dst, xs)
			return
		}
	}
	for lo := 0; lo < n; lo += sumBlock {
		hi := min(lo+sumBlock, n)
		CopyLE(dst[lo:hi], srcs[0][4*(off+lo):4*(off+hi)])
		for _, s := range srcs[1:] {
			AddLE(dst[lo:hi], s[4*(off+lo):4*(off+hi)])
		}
	}
}

// foldSIMD is sumRange in assembly: the payloads are read where they are (any alignment), each
// block of 32 elements summed over every rank in registers before it is stored, so dst is
// written once and each payload read once. More than 64 ranks are summed 63 at a time into dst.
func foldSIMD(dst []float32, srcs [][]byte, off int) {
	n := len(dst)
	if k := n &^ 7; k > 0 {
		var ptrs [64]unsafe.Pointer
		for r := 0; r < len(srcs); {
			j := 0
			if r > 0 { // continue from the partial sum
				ptrs[0] = unsafe.Pointer(&dst[0])
				j = 1
			}
			for ; j < len(ptrs) && r < len(srcs); j++ {
				ptrs[j] = unsafe.Pointer(&srcs[r][4*off])
				r++
			}
			foldAVX2(&dst[0], &ptrs[0], j, k)
		}
	}
	for i := n &^ 7; i < n; i++ {
		b := 4 * (off + i)
		x := le(srcs[0][b:])
		for _, s := range srcs[1:] {
			x += le(s[b:])
		}
		dst[i] = x
	}
}

// addSIMD sets dst[i] += the float32 at src+4i, for len(dst) > 0 elements at any alignment.
func addSIMD(dst []float32, src unsafe.Pointer) {
	n := len(dst)
	if k := n &^ 7; k > 0 {
		ptrs := [2]unsafe.Pointer{unsafe.Pointer(&dst[0]), src}
		foldAVX2(&dst[0], &ptrs[0], 2, k)
	}
	if k := n &^ 7; k < n {
		tail := unsafe.Slice((*byte)(unsafe.Add(src, 4*k)), 4*(n-k))
		for i := range n - k {
			dst[k+i] += le(tail[4*i:])
		}
	}
}

// sumFloats is SumLE on float32s.
func sumFloats(dst []float32, xs [][]float32) {
	for lo := 0; lo < len(dst); lo += sumBlock {
		hi := min(lo+sumBlock, len(dst))
		d := dst[lo:hi]
		copy(d, xs[0][lo:hi])
		r := 1
		for ; r+4 <= len(xs); r += 4 {
			add4(d, xs[r][lo:hi], xs[r+1][lo:hi], xs[r+2][lo:hi], xs[r+3][lo:hi])
		}
		switch len(xs) - r {
		case 3:
			add3(d, xs[r][lo:hi], xs[r+1][lo:hi], xs[r+2][lo:hi])
		case 2:
			add2(d, xs[r][lo:hi], xs[r+1][lo:hi])
		case 1:
			Add(d, xs[r][lo:hi])
		}
	}
}

func add4(dst, a, b, c, d []float32) {
	a, b, c, d = a[:len(dst)], b[:len(dst)], c[:len(dst)], d[:len(dst)]
	for i := range dst {
		dst[i] = dst[i] + a[i] + b[i] + c[i] + d[i]
	}
}

func add3(dst, a, b, c []float32) {
	a, b, c = a[:len(dst)], b[:len(dst)], c[:len(dst)]
	for i := range dst {
		dst[i] = dst[i] + a[i] + b[i] + c[i]
	}
}

func add2(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = dst[i] + a[i] + b[i]
	}
}
