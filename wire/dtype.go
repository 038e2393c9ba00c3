package wire

import (
	"encoding/binary"
	"math"
	"strconv"
	"unsafe"
)

// Element types on the wire (the values of HdrDtype). Gradients may be any of them; checkpoints,
// uploads and step-0 parameters are f32; parameters after step 0 are f32, or bf16 for a job with
// param_dtype bf16 (messages.go).
const (
	DtypeF32  = "f32"  // little-endian IEEE-754 binary32
	DtypeBF16 = "bf16" // little-endian bfloat16: the top 16 bits of a binary32
	DtypeF16  = "f16"  // little-endian IEEE-754 binary16
)

// Dtype is an element type on the wire. The zero value is F32.
type Dtype uint8

const (
	F32 Dtype = iota
	BF16
	F16
)

// String is the dtype's header value.
func (d Dtype) String() string {
	switch d {
	case F32:
		return DtypeF32
	case BF16:
		return DtypeBF16
	case F16:
		return DtypeF16
	}
	return "dtype(" + strconv.Itoa(int(d)) + ")"
}

// ElemSize is the bytes of one element: 4 for f32, 2 for bf16 and f16.
func (d Dtype) ElemSize() int {
	if d == F32 {
		return 4
	}
	return 2
}

// Valid reports whether d is one of F32, BF16, F16.
func (d Dtype) Valid() bool { return d <= F16 }

// ParseDtype reads a HdrDtype value: exactly "f32", "bf16" or "f16".
func ParseDtype(s string) (Dtype, bool) {
	switch s {
	case DtypeF32:
		return F32, true
	case DtypeBF16:
		return BF16, true
	case DtypeF16:
		return F16, true
	}
	return F32, false
}

// Conversions. From 16 bits to float32 every value is exact (both formats are subsets of
// binary32; NaN payloads are kept, shifted into the high bits). From float32 to 16 bits:
//   - finite values round to nearest, ties to even, on the bits (IEEE-754 roundTiesToEven);
//   - a value whose rounding exceeds the format's largest finite value becomes Inf of its sign
//     (f16: |x| >= 65520; bf16: |x| >= 0x1.ffp127 rounded up past 0x1.fep127);
//   - Inf stays Inf, signed zeros keep their sign;
//   - any NaN becomes the canonical quiet NaN with its sign kept (bf16 0x7fc0, f16 0x7e00, with
//     0x8000 for a negative sign), payload dropped;
//   - f16 has subnormals (2^-24 apart below 2^-14): values below 2^-14 round to them exactly
//     once, ties to even (|x| <= 2^-25 gives zero); bf16 has float32's exponent range, its
//     subnormals are float32's subnormals rounded like any other value (never flushed to zero).

// BF16ToF32 converts one bfloat16 (its bits) to float32, exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds a float32 to bfloat16 (round to nearest even; NaN to the quiet NaN of its sign).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16)&0x8000 | 0x7fc0
	}
	b += 0x7fff + (b>>16)&1 // a carry into the exponent is the right result, up to Inf
	return uint16(b >> 16)
}

// F16ToF32 converts one IEEE binary16 (its bits) to float32, exactly.
func F16ToF32(h uint16) float32 { return f16Table[h] }

func f16ToF32Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f: // Inf, NaN (payload kept)
		return sign | 0x7f800000 | m<<13
	case e != 0:
		return sign | (e+112)<<23 | m<<13
	case m == 0:
		return sign
	}
	e = 113 // subnormal m*2^-24: normalize
	for m&0x400 == 0 {
		m <<= 1
		e--
	}
	return sign | e<<23 | (m&0x3ff)<<13
}

// F32ToF16 rounds a float32 to IEEE binary16 (round to nearest even, subnormals kept, overflow to
// Inf, NaN to the quiet NaN of its sign).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7e00
	case a >= 0x477ff000: // >= 65520 (halfway from 65504 to 2^16, ties away from odd 0x3ff): Inf
		return sign | 0x7c00
	case a >= 0x38800000: // >= 2^-14: a normal half
		a -= 112 << 23 // rebias the exponent: 127 -> 15
		a += 0xfff + (a>>13)&1
		return sign | uint16(a>>13) // a carry into the exponent is the right result
	case a <= 0x33000000: // <= 2^-25: zero (2^-25 is the tie between 0 and 2^-24, to even)
		return sign
	}
	e := a >> 23 // 102..112: a subnormal half, a multiple of 2^-24
	m := a&0x7fffff | 0x800000
	shift := 126 - e // m*2^(e-150) / 2^-24 = m >> (126-e)
	q, r, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
	if r > half || r == half && q&1 == 1 {
		q++ // may reach 0x400: the smallest normal, which is its right encoding
	}
	return sign | uint16(q)
}

// f16Table is F16ToF32 for every pattern (256 KiB): the fold kernels decode f16 by lookup.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = math.Float32frombits(f16ToF32Bits(uint16(i)))
	}
	return &t
}()

// F16Table returns the table F16ToF32 reads (for kernels; do not modify it).
func F16Table() *[1 << 16]float32 { return f16Table }

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Encode writes src into dst as dt, little-endian; len(dst) must be len(src)*dt.ElemSize(). It
// does not allocate.
func Encode(dst []byte, src []float32, dt Dtype) {
	checkLen(len(dst), len(src), dt)
	switch dt {
	case F32:
		if littleEndian && len(src) > 0 {
			copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
			return
		}
		for i, f := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	case BF16:
		k := encode16SIMD(dst, src, dt)
		for i, f := range src[k:] {
			binary.LittleEndian.PutUint16(dst[2*(k+i):], F32ToBF16(f))
		}
	case F16:
		k := encode16SIMD(dst, src, dt)
		for i, f := range src[k:] {
			binary.LittleEndian.PutUint16(dst[2*(k+i):], F32ToF16(f))
		}
	}
}

// Decode converts src, little-endian elements of dt, into dst (exactly); len(src) must be
// len(dst)*dt.ElemSize(). It does not allocate.
func Decode(dst []float32, src []byte, dt Dtype) {
	checkLen(len(src), len(dst), dt)
	switch dt {
	case F32:
		if littleEndian && len(dst) > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
			return
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		k := decodeBF16SIMD(dst, src)
		for i := k; i < len(dst); i++ {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		t := f16Table
		for i := range dst {
			dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
		}
	}
}

// Round sets dst[i] to src[i] rounded to dt and back (what the receiver of Encode(src, dt)
// decodes); for F32 a copy. It does not allocate.
func Round(dst, src []float32, dt Dtype) {
	switch dt {
	case BF16:
		for i, f := range src {
			dst[i] = BF16ToF32(F32ToBF16(f))
		}
	case F16:
		for i, f := range src {
			dst[i] = f16Table[F32ToF16(f)]
		}
	default:
		copy(dst, src)
	}
}

// NonFinite returns the index of the first NaN or Inf element of a dt payload, or -1.
func NonFinite(src []byte, dt Dtype) int {
	switch dt {
	case BF16:
		return nonFinite16(src, 0x7f80, 0x0080)
	case F16:
		return nonFinite16(src, 0x7c00, 0x0400)
	default:
		return nonFiniteF32(src)
	}
}

// nonFinite16 is NonFinite for 16-bit payloads whose exponent field is exp and its lowest bit
// low: finiteBlocks with four elements to a 64-bit word (e + low at most reaches 0x8000, so no
// element carries into the next), then element by element.
func nonFinite16(src []byte, exp, low uint64) int {
	const rep4 = 0x0001000100010001
	i := finiteBlocks(src, exp*rep4, low*rep4, 0x8000*rep4)
	for ; i+1 < len(src); i += 2 {
		if uint64(binary.LittleEndian.Uint16(src[i:]))&exp == exp {
			return i / 2
		}
	}
	return -1
}

// nonFiniteF32 is NonFinite for f32 payloads, the check of every gradient of a job that refuses
// NaN and Inf: finiteBlocks with two elements to a 64-bit word (e + 1 << 23 is at most 1 << 31,
// so the halves cannot carry into each other), then element by element.
func nonFiniteF32(src []byte) int {
	i := finiteBlocks(src, 0x7f800000<<32|0x7f800000, 1<<55|1<<23, 1<<63|1<<31)
	for ; i+3 < len(src); i += 4 {
		if binary.LittleEndian.Uint32(src[i:])&0x7f800000 == 0x7f800000 {
			return i / 4
		}
	}
	return -1
}

// finiteBlocks returns how many leading bytes of src, in whole 64-byte blocks, it found free of
// NaN and Inf: it stops at the first block that may hold one, for the caller to search element by
// element. exp, carry and sign repeat an element's exponent field, the lowest bit of that field
// and its sign bit over a 64-bit word: an element's exponent field (e) plus its lowest bit carries
// into the element's sign bit exactly when e is all ones. binary.LittleEndian.Uint64 compiles to
// one unaligned load on amd64 and arm64, so a payload needs no alignment, and it decodes
// little-endian on any machine.
func finiteBlocks(src []byte, exp, carry, sign uint64) int {
	i := 0
	for ; i+64 <= len(src); i += 64 {
		b := (*[64]byte)(src[i:])
		x := (binary.LittleEndian.Uint64(b[0:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[8:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[16:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[24:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[32:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[40:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[48:])&exp + carry) |
			(binary.LittleEndian.Uint64(b[56:])&exp + carry)
		if x&sign != 0 {
			break
		}
	}
	return i
}

func checkLen(bytes, elems int, dt Dtype) {
	if !dt.Valid() {
		panic("wire: " + dt.String() + " is not a dtype")
	}
	if bytes != elems*dt.ElemSize() {
		panic("wire: " + strconv.Itoa(bytes) + " bytes for " + strconv.Itoa(elems) + " " + dt.String() + " elements")
	}
}
