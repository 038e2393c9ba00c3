package demo

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// A note on float64(a*b) + c, used throughout the package: the explicit conversion rounds the
// product, which stops the compiler from fusing the multiply and add into one FMA instruction on
// architectures that have one (arm64, ppc64le, s390x, amd64 with GOAMD64=v3). Without it the same
// code gives different bits on different machines.

// Stream identifiers: each use of randomness has its own PCG stream, so changing one size (say,
// TrainSize) does not change anything else (say, the test set).
const (
	streamCenters = iota + 1
	streamWarp
	streamTrain
	streamTest
	streamInit
)

// rng turns a PCG stream into floats using integer arithmetic only, so its output does not depend
// on the Go release or the platform (the methods of rand.Rand are not promised stable).
type rng struct{ src *rand.PCG }

func newRNG(seed, stream uint64) rng { return rng{rand.NewPCG(seed, stream)} }

// uniform returns a float64 in [0, 1) with 53 random bits.
func (r rng) uniform() float64 { return float64(r.src.Uint64()>>11) * 0x1p-53 }

// symmetric returns a float64 in [-1, 1).
func (r rng) symmetric() float64 { return float64(2*r.uniform()) - 1 }

// bell returns an approximately standard normal number: the centred sum of four uniforms, scaled
// to unit variance. It needs no transcendental functions, unlike Box-Muller or a ziggurat.
func (r rng) bell() float64 {
	s := r.uniform() + r.uniform() + r.uniform() + r.uniform()
	return (s - 2) * math.Sqrt(3) // math.Sqrt is correctly rounded everywhere
}

// intn returns an int in [0, n), n > 0, by Lemire's multiply-shift (bias below 2^-32 for small n).
func (r rng) intn(n int) int {
	hi, _ := bits.Mul64(r.src.Uint64(), uint64(n))
	return int(hi)
}

const (
	ln2Hi = 6.93147180369123816490e-01 // ln 2, upper bits: k*ln2Hi is exact for |k| < 2^20
	ln2Lo = 1.90821492927058770002e-10 // ln 2 - ln2Hi
	log2e = 1.44269504088896338700e+00 // 1 / ln 2
)

// expCoef are 1/n! for n = 12 down to 0, for Horner's scheme: the Taylor series of e^r to r^12
// has a truncation error below 1e-14 for |r| <= ln2/2.
var expCoef = [...]float64{
	1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040,
	1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1, 1,
}

// detExp returns e^x with a relative error of a few ulps, identically on every platform.
// It returns 0 for x < -700 and +Inf for x > 700; softmax only calls it with x <= 0.
func detExp(x float64) float64 {
	switch {
	case math.IsNaN(x):
		return x
	case x < -700:
		return 0
	case x > 700:
		return math.Inf(1)
	}
	// x = k ln2 + r with |r| <= ln2/2, so e^x = 2^k e^r.
	k := math.Floor(float64(x*log2e) + 0.5) // Floor is exact, whatever implements it
	r := float64(x-float64(k*ln2Hi)) - float64(k*ln2Lo)
	p := 0.0
	for _, c := range expCoef {
		p = float64(p*r) + c
	}
	return p * math.Float64frombits(uint64(int64(k)+1023)<<52) // exact: 2^k is normal
}

// detLog returns the natural logarithm of x with a relative error of a few ulps, identically on
// every platform. It handles positive normal x (and returns NaN otherwise); softmax calls it with
// x >= 1.
func detLog(x float64) float64 {
	if !(x >= 0x1p-1022) || math.IsInf(x, 1) {
		return math.NaN()
	}
	// x = 2^e m with m in [sqrt(1/2), sqrt(2)).
	b := math.Float64bits(x)
	e := int64(b>>52&0x7ff) - 1023
	m := math.Float64frombits(b&^(0x7ff<<52) | 1023<<52)
	if m > math.Sqrt2 {
		m /= 2 // exact
		e++
	}
	// log m = 2 atanh s = 2(s + s^3/3 + s^5/5 + ...) with s = (m-1)/(m+1), |s| < 0.1716.
	f := m - 1 // exact (Sterbenz)
	s := f / (2 + f)
	s2 := float64(s * s)
	sum := 0.0
	for n := 21.0; n >= 3; n -= 2 {
		sum = float64(float64(sum+1/n) * s2)
	}
	logm := float64(2*s) * (1 + sum)
	ek := float64(e)
	return float64(ek*ln2Hi) + (float64(ek*ln2Lo) + float64(logm))
}
