package functions

import (
	"encoding/binary"
	"math"
	"strconv"
	"unsafe"

	"github.com/fanin-ml/fanin/wire"
)

// 16-bit gradient kernels: a payload of little-endian bf16 or f16 elements (wire.BF16, wire.F16)
// is converted to float32 exactly (wire.BF16ToF32, wire.F16ToF32) and then takes part in the
// float32 arithmetic of its f32 counterpart, so CopyLE16, AddLE16, ScaleLE16 and AxpyLE16 give
// the bits of CopyLE, AddLE, ScaleLE and AxpyLE fed the converted values. They take a wire.F32
// payload too (and then are those kernels). None of them allocates.

func check16(n int, src []byte, dt wire.Dtype) {
	if !dt.Valid() || len(src) != n*dt.ElemSize() {
		panic("functions: " + dt.String() + " payload of " + strconv.Itoa(len(src)) + " bytes for " + strconv.Itoa(n) + " elements")
	}
}

func bf16At(src []byte, i int) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
}

// asHalves returns b reinterpreted as uint16s when that is the same as decoding it
// little-endian: on a little-endian machine with b 2-byte aligned (payloads normally are).
func asHalves(b []byte) ([]uint16, bool) {
	if !littleEndian || len(b) < 2 || uintptr(unsafe.Pointer(&b[0]))%2 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2), true
}

func addBF16(dst []float32, h []uint16) {
	h = h[:len(dst)]
	for i, x := range h {
		dst[i] += math.Float32frombits(uint32(x) << 16)
	}
}

func addF16(dst []float32, h []uint16) {
	h = h[:len(dst)]
	t := wire.F16Table()
	for i, x := range h {
		dst[i] += t[x]
	}
}

// CopyLE16 sets dst[i] to element i of the dt payload src, converted exactly.
func CopyLE16(dst []float32, src []byte, dt wire.Dtype) {
	if dt == wire.F32 {
		CopyLE(dst, src)
		return
	}
	check16(len(dst), src, dt)
	k := cvt16SIMD(dst, src, dt == wire.F16)
	wire.Decode(dst[k:], src[2*k:], dt)
}

// AddLE16 adds element i of the dt payload src, converted exactly, to dst[i].
func AddLE16(dst []float32, src []byte, dt wire.Dtype) {
	switch dt {
	case wire.F32:
		AddLE(dst, src)
	case wire.BF16:
		check16(len(dst), src, dt)
		k := add16SIMD(dst, src, false)
		dst, src = dst[k:], src[2*k:]
		if h, ok := asHalves(src); ok {
			addBF16(dst, h)
			return
		}
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] += bf16At(src, i)
		}
	default:
		check16(len(dst), src, dt)
		k := add16SIMD(dst, src, true)
		dst, src = dst[k:], src[2*k:]
		if h, ok := asHalves(src); ok {
			addF16(dst, h)
			return
		}
		src = src[:2*len(dst)]
		t := wire.F16Table()
		for i := range dst {
			dst[i] += t[binary.LittleEndian.Uint16(src[2*i:])]
		}
	}
}

// ScaleLE16 sets dst[i] = w*x[i], x[i] element i of the dt payload src converted exactly.
func ScaleLE16(dst []float32, w float32, src []byte, dt wire.Dtype) {
	switch dt {
	case wire.F32:
		ScaleLE(dst, w, src)
	case wire.BF16:
		check16(len(dst), src, dt)
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = float32(w * bf16At(src, i))
		}
	default:
		check16(len(dst), src, dt)
		src = src[:2*len(dst)]
		t := wire.F16Table()
		for i := range dst {
			dst[i] = float32(w * t[binary.LittleEndian.Uint16(src[2*i:])])
		}
	}
}

// AxpyLE16 adds w*x[i] to dst[i], x[i] element i of the dt payload src converted exactly; the
// product is rounded to float32 before the sum (no FMA), as in AxpyLE.
func AxpyLE16(dst []float32, w float32, src []byte, dt wire.Dtype) {
	switch dt {
	case wire.F32:
		AxpyLE(dst, w, src)
	case wire.BF16:
		check16(len(dst), src, dt)
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] += float32(w * bf16At(src, i))
		}
	default:
		check16(len(dst), src, dt)
		src = src[:2*len(dst)]
		t := wire.F16Table()
		for i := range dst {
			dst[i] += float32(w * t[binary.LittleEndian.Uint16(src[2*i:])])
		}
	}
}

// SumLE16 sums N payloads of any dtypes (srcs[r] of dts[r]) at once, with the bits of CopyLE16
// of rank 0 then AddLE16 of ranks 1..N-1 in rank order: chunk by chunk of 1024 elements (the
// accumulator's chunk stays in the L1 cache while every rank is added to it).
func SumLE16(dst []float32, srcs [][]byte, dts []wire.Dtype) {
	if len(srcs) != len(dts) {
		panic("functions: SumLE16 with " + strconv.Itoa(len(srcs)) + " payloads and " + strconv.Itoa(len(dts)) + " dtypes")
	}
	if len(srcs) == 0 {
		clear(dst)
		return
	}
	for r, s := range srcs {
		check16(len(dst), s, dts[r])
	}
	for off := 0; off < len(dst); off += chunk {
		n := min(chunk, len(dst)-off)
		d := dst[off : off+n]
		for r, s := range srcs {
			es := dts[r].ElemSize()
			if r == 0 {
				CopyLE16(d, s[off*es:(off+n)*es], dts[r])
			} else {
				AddLE16(d, s[off*es:(off+n)*es], dts[r])
			}
		}
	}
}
