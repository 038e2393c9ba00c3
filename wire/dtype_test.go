package wire

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// refRound rounds x to a binary format with mbits fraction bits, smallest exponent emin (below it,
// subnormals with quantum 2^(emin-mbits)) and largest finite value maxFinite, ties to even, by a
// computation in float64 unrelated to the bit tricks under test: the quantum of x's binade,
// math.RoundToEven of x/quantum (exact scalings by powers of two), then overflow to Inf.
func refRound(x float64, mbits, emin int, maxFinite float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return x
	}
	_, e := math.Frexp(math.Abs(x)) // |x| = f*2^e, f in [0.5, 1): binade exponent e-1
	qe := max(e-1-mbits, emin-mbits)
	r := math.Ldexp(math.RoundToEven(math.Ldexp(x, -qe)), qe)
	if math.Abs(r) > maxFinite {
		return math.Copysign(math.Inf(1), x)
	}
	if r == 0 {
		return math.Copysign(0, x)
	}
	return r
}

var (
	maxF16  = 65504.0
	maxBF16 = float64(math.Float32frombits(0x7f7f0000))
)

func refF16(f float32) float64  { return refRound(float64(f), 10, -14, maxF16) }
func refBF16(f float32) float64 { return refRound(float64(f), 7, -126, maxBF16) }

func sameValue(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return a == b && math.Signbit(a) == math.Signbit(b)
}

// Every 16-bit pattern converts to float32 exactly (checked against its value computed from the
// fields in float64) and back to the same bits; NaNs come back as the quiet NaN of their sign.
func TestSixteenBitRoundTripExhaustive(t *testing.T) {
	t.Parallel()
	for i := range 1 << 16 {
		h := uint16(i)
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		// f16: fields -> value
		e, m := int(h>>10&0x1f), float64(h&0x3ff)
		var want float64
		switch {
		case e == 0x1f && m == 0:
			want = math.Inf(int(sign))
		case e == 0x1f:
			want = math.NaN()
		case e == 0:
			want = sign * math.Ldexp(m, -24)
		default:
			want = sign * math.Ldexp(1+m/1024, e-15)
		}
		f := F16ToF32(h)
		if !sameValue(float64(f), want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, f, want)
		}
		back := F32ToF16(f)
		if e == 0x1f && m != 0 {
			if back != h&0x8000|0x7e00 {
				t.Fatalf("f16 NaN %#04x came back as %#04x", h, back)
			}
		} else if back != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, back)
		}
		// bf16: fields -> value
		e, m = int(h>>7&0xff), float64(h&0x7f)
		switch {
		case e == 0xff && m == 0:
			want = math.Inf(int(sign))
		case e == 0xff:
			want = math.NaN()
		case e == 0:
			want = sign * math.Ldexp(m, -133)
		default:
			want = sign * math.Ldexp(1+m/128, e-127)
		}
		f = BF16ToF32(h)
		if !sameValue(float64(f), want) {
			t.Fatalf("BF16ToF32(%#04x) = %v, want %v", h, f, want)
		}
		back = F32ToBF16(f)
		if e == 0xff && m != 0 {
			if back != h&0x8000|0x7fc0 {
				t.Fatalf("bf16 NaN %#04x came back as %#04x", h, back)
			}
		} else if back != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, back)
		}
	}
}

// float32 -> 16 bits against refRound, on edge values (every tie and its neighbours around each
// 16-bit value near the ranges' ends) and random bit patterns.
func TestF32To16AgainstReference(t *testing.T) {
	t.Parallel()
	check := func(f float32) {
		t.Helper()
		if got, want := float64(F16ToF32(F32ToF16(f))), refF16(f); !sameValue(got, want) {
			t.Fatalf("f16 rounding of %v (%#08x): %v, want %v", f, math.Float32bits(f), got, want)
		}
		if got, want := float64(BF16ToF32(F32ToBF16(f))), refBF16(f); !sameValue(got, want) {
			t.Fatalf("bf16 rounding of %v (%#08x): %v, want %v", f, math.Float32bits(f), got, want)
		}
	}
	edges := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		65504, 65505, 65519.99, 65520, 65536, math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, 0x1p-24, 0x1p-25, 0x1.0001p-25, 0x1p-26, 0x1.8p-24, 0x1.4p-24,
		0x1p-14, 0x1.ffcp-15, 0x1.ffep-15, 0x1.fffp-15, float32(math.NaN())}
	for _, f := range edges {
		check(f)
		check(-f)
	}
	// Around every 16-bit value: the value, the midpoints to its neighbours, one ulp of float32
	// either side of them.
	for i := range 1 << 16 {
		for _, v := range []float32{F16ToF32(uint16(i)), BF16ToF32(uint16(i))} {
			b := math.Float32bits(v)
			for d := -3; d <= 3; d++ {
				for _, off := range []uint32{0, 1 << 12, 1 << 15} { // f16 and bf16 half-ulps
					check(math.Float32frombits(b + uint32(d) + off))
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		check(math.Float32frombits(rng.Uint32()))
	}
	for range 1 << 18 { // the f16 range, densely
		check(float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(44)-28)))
	}
	// NaNs of any payload: the canonical quiet NaN, sign kept
	for _, b := range []uint32{0x7f800001, 0x7fc00000, 0xffffffff, 0xff800001, 0x7fbfffff} {
		f := math.Float32frombits(b)
		if got := F32ToBF16(f); got != uint16(b>>16)&0x8000|0x7fc0 {
			t.Errorf("F32ToBF16(%#08x) = %#04x", b, got)
		}
		if got := F32ToF16(f); got != uint16(b>>16)&0x8000|0x7e00 {
			t.Errorf("F32ToF16(%#08x) = %#04x", b, got)
		}
	}
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestEncodeDecode(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]float32, 1001)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	src[7] = float32(math.Inf(-1))
	for _, dt := range []Dtype{F32, BF16, F16} {
		b := make([]byte, len(src)*dt.ElemSize())
		Encode(b, src, dt)
		got := make([]float32, len(src))
		Decode(got, b, dt)
		want := make([]float32, len(src))
		Round(want, src, dt)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s element %d: %v, want %v", dt, i, got[i], want[i])
			}
			if dt == F32 && got[i] != src[i] {
				t.Fatalf("f32 element %d changed", i)
			}
		}
		if i := NonFinite(b, dt); i != 7 {
			t.Errorf("%s: NonFinite = %d, want 7", dt, i)
		}
		if n := testing.AllocsPerRun(10, func() { Encode(b, src, dt); Decode(got, b, dt) }); n != 0 {
			t.Errorf("%s: %v allocations", dt, n)
		}
		if p, ok := ParseDtype(dt.String()); !ok || p != dt || !dt.Valid() {
			t.Errorf("ParseDtype(%q) = %v, %v", dt, p, ok)
		}
	}
	for _, s := range []string{"", "F32", "fp16", "bfloat16", "f64", " f16"} {
		if _, ok := ParseDtype(s); ok {
			t.Errorf("ParseDtype(%q) accepted", s)
		}
	}
}

func TestCheckPayload(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		data   []byte
		dt     Dtype
		want   Reason
		detail string
	}{
		{make([]byte, 6), BF16, "", ""},
		{make([]byte, 6), F16, "", ""},
		{make([]byte, 12), F32, "", ""},
		{make([]byte, 12), BF16, ReasonOversized, "shard 5 holds 3 bf16 elements (6 bytes)"},
		{make([]byte, 4), F16, ReasonBadLength, "payload is 4 bytes, shard 5 holds 3 f16 elements (6 bytes)"},
		{make([]byte, 6), F32, ReasonBadLength, "3 f32 elements (12 bytes)"},
		{make([]byte, 13), F32, ReasonBadLength, "not whole f32 elements"},
		{make([]byte, 9), BF16, ReasonBadLength, "9 bytes, not whole bf16 elements (2 bytes each); shard 5 holds 3 bf16 elements (6 bytes)"},
		{[]byte{0, 0, 0, 0, 0x80, 0xff}, BF16, ReasonNonFinite, "element 2 (bf16)"}, // -Inf
		{[]byte{0, 0, 1, 0x7c, 0, 0}, F16, ReasonNonFinite, "element 1 (f16)"},      // NaN
		{[]byte{0, 0, 0, 0x7b, 0, 0x80}, F16, "", ""},                               // 61440, -0
	} {
		rej := CheckPayload(c.data, c.dt, 3, 5, true)
		if c.want == "" {
			if rej != nil {
				t.Errorf("%s %x: %v", c.dt, c.data, rej)
			}
			continue
		}
		if rej == nil || rej.Reason != c.want || !strings.Contains(rej.Detail, c.detail) {
			t.Errorf("%s %x: %v, want %s (%q)", c.dt, c.data, rej, c.want, c.detail)
		}
		if c.want == ReasonNonFinite && CheckPayload(c.data, c.dt, 3, 5, false) != nil {
			t.Errorf("%s %x refused with allow_nonfinite", c.dt, c.data)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	const n = 1 << 20
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i) * 1e-3
	}
	dst := make([]byte, 4*n)
	for _, dt := range []Dtype{BF16, F16, F32} {
		b.Run(dt.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				Encode(dst[:n*dt.ElemSize()], src, dt)
			}
		})
	}
}

// Encode (the assembly where the CPU has it, and the Go loop) gives F32ToBF16's and F32ToF16's
// bits on every 16-bit value's neighbourhood (ties included), NaNs of any payload, and random bit
// patterns, at even and odd offsets.
// Not parallel: it switches useSIMD, which every test's Encode and Decode read.
func TestEncodeMatchesScalar(t *testing.T) {
	var src []float32
	for i := range 1 << 16 {
		for _, v := range []float32{F16ToF32(uint16(i)), BF16ToF32(uint16(i))} {
			b := math.Float32bits(v)
			for _, off := range []uint32{0, 1, 1<<12 - 1, 1 << 12, 1<<12 + 1, 1<<15 - 1, 1 << 15, 1<<15 + 1} {
				src = append(src, math.Float32frombits(b+off))
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for range 1 << 18 {
		src = append(src, math.Float32frombits(rng.Uint32()))
	}
	for _, b := range []uint32{0x7f800001, 0xffbfffff, 0x7fc00000, 0xff800001} {
		src = append(src, math.Float32frombits(b))
	}
	for _, simd := range []bool{true, false} {
		useSIMD = simd
		for _, dt := range []Dtype{BF16, F16} {
			for _, off := range []int{0, 1} {
				buf := make([]byte, off+2*len(src))[off:]
				Encode(buf, src, dt)
				for i, f := range src {
					want := F32ToBF16(f)
					if dt == F16 {
						want = F32ToF16(f)
					}
					if got := binary.LittleEndian.Uint16(buf[2*i:]); got != want {
						useSIMD = true
						t.Fatalf("simd %v %s offset %d: Encode(%#08x) = %#04x, want %#04x", simd, dt, off, math.Float32bits(f), got, want)
					}
				}
			}
		}
	}
	useSIMD = true
}

// Decode of bf16 (eight at a time on amd64 with AVX2) gives BF16ToF32 of every pattern, at any
// source address and length.
// Not parallel: it switches useSIMD, which every test's Encode and Decode read.
func TestDecodeBF16MatchesScalar(t *testing.T) {
	src := make([]byte, 1+2*(1<<16+13))
	for i := range 1<<16 + 13 {
		binary.LittleEndian.PutUint16(src[1+2*i:], uint16(i*40503))
	}
	for _, simd := range []bool{true, false} {
		useSIMD = simd
		for _, off := range []int{0, 1} {
			for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 1<<16 + 13} {
				b := src[off : off+2*n]
				dst := make([]float32, n)
				Decode(dst, b, BF16)
				for i := range dst {
					if want := BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])); math.Float32bits(dst[i]) != math.Float32bits(want) {
						useSIMD = true
						t.Fatalf("simd %v offset %d n %d: element %d = %#08x, want %#08x", simd, off, n, i, math.Float32bits(dst[i]), math.Float32bits(want))
					}
				}
			}
		}
	}
	useSIMD = true
}

// The f32 check, 16 elements at a time, finds the first NaN or Inf as an element-by-element scan
// does: at every position of payloads that span several blocks, among neighbours whose exponent is
// one short of all ones, with either sign.
func TestNonFiniteF32MatchesScan(t *testing.T) {
	t.Parallel()
	scan := func(b []byte) int {
		for i := 0; i+3 < len(b); i += 4 {
			if binary.LittleEndian.Uint32(b[i:])&0x7f800000 == 0x7f800000 {
				return i / 4
			}
		}
		return -1
	}
	near := []uint32{0x7f7fffff, 0xff7fffff, 0x7f000000, 0x00800000, 0x80000000, 0}
	bad := []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffffffff, 0x7f800001}
	for n := 0; n <= 50; n++ {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], near[(i*7+n)%len(near)])
		}
		if got, want := NonFinite(b, F32), scan(b); got != want || want != -1 {
			t.Fatalf("n=%d, all finite: NonFinite = %d, scan = %d", n, got, want)
		}
		for pos := range n {
			for _, v := range bad {
				c := slices.Clone(b)
				binary.LittleEndian.PutUint32(c[4*pos:], v)
				if pos+3 < n { // a second one after it: the first is the answer
					binary.LittleEndian.PutUint32(c[4*(pos+3):], bad[0])
				}
				if got := NonFinite(c, F32); got != pos {
					t.Fatalf("n=%d, %#08x at %d: NonFinite = %d", n, v, pos, got)
				}
			}
		}
	}
}

// DecodeParams reads a parameters message by its dtype, f32 when the header is absent, and refuses
// a dtype it does not know and a length that does not fit the shard in the message's dtype.
func TestDecodeParams(t *testing.T) {
	t.Parallel()
	vals := []float32{1, -2.5, 3.0078125, 0}
	for _, c := range []struct {
		hdr  string
		dt   Dtype
		want []float32
	}{
		{"", F32, vals}, {"f32", F32, vals}, {"bf16", BF16, []float32{1, -2.5, 3, 0}}, {"f16", F16, vals},
	} {
		b := make([]byte, len(vals)*c.dt.ElemSize())
		Encode(b, vals, c.dt)
		h := nats.Header{}
		if c.hdr != "" {
			h.Set(HdrDtype, c.hdr)
		}
		dst := make([]float32, len(vals))
		dt, err := DecodeParams(dst, h, b)
		if err != nil || dt != c.dt || !slices.Equal(dst, c.want) {
			t.Errorf("%q: %v %v %v, want %v %v", c.hdr, dst, dt, err, c.want, c.dt)
		}
		if _, err := DecodeParams(dst, h, b[:len(b)-1]); err == nil || !strings.Contains(err.Error(), c.dt.String()+" elements") {
			t.Errorf("%q short: %v", c.hdr, err)
		}
	}
	h := nats.Header{}
	h.Set(HdrDtype, "fp8")
	if _, err := DecodeParams(make([]float32, 1), h, make([]byte, 4)); err == nil || !strings.Contains(err.Error(), `"fp8"`) {
		t.Errorf("fp8: %v", err)
	}
}

// The 16-bit checks, 32 elements at a time, find the first NaN or Inf as an element-by-element
// scan does, for every one of the 65,536 patterns placed at every position of a payload that spans
// blocks, among neighbours of every finite pattern, at even and odd addresses.
func TestNonFinite16MatchesScan(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dt  Dtype
		exp uint16
	}{{BF16, 0x7f80}, {F16, 0x7c00}} {
		scan := func(b []byte) int {
			for i := 0; i+1 < len(b); i += 2 {
				if binary.LittleEndian.Uint16(b[i:])&c.exp == c.exp {
					return i / 2
				}
			}
			return -1
		}
		var finite []uint16
		for h := range 1 << 16 {
			if uint16(h)&c.exp != c.exp {
				finite = append(finite, uint16(h))
			}
		}
		const n = 75 // two blocks of 32 and a tail
		buf := make([]byte, 1+2*n)
		for _, off := range []int{0, 1} {
			b := buf[off : off+2*n]
			k := 0
			fill := func() {
				for i := range n {
					binary.LittleEndian.PutUint16(b[2*i:], finite[k%len(finite)])
					k += 7919
				}
			}
			for range 200 {
				fill()
				if got := NonFinite(b, c.dt); got != -1 {
					t.Fatalf("%s offset %d, all finite: NonFinite = %d", c.dt, off, got)
				}
			}
			for h := range 1 << 16 {
				fill()
				pos := h % n
				binary.LittleEndian.PutUint16(b[2*pos:], uint16(h))
				if got, want := NonFinite(b, c.dt), scan(b); got != want {
					t.Fatalf("%s offset %d, %#04x at %d: NonFinite = %d, scan = %d", c.dt, off, h, pos, got, want)
				}
			}
		}
	}
}
