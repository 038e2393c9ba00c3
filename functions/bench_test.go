package functions

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

var benchShards = []struct {
	name  string
	bytes int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}}

const benchRanks = 8

// benchPayloads returns benchRanks encoded shards of the given size, at 4-byte aligned
// addresses, or at odd ones when unaligned.
func benchPayloads(size int, unaligned bool) [][]byte {
	rng := rand.New(rand.NewPCG(1, 1))
	out := make([][]byte, benchRanks)
	for r := range out {
		aligned, odd := byteBufs(size)
		p := aligned
		if unaligned {
			p = odd
		}
		x := make([]float32, size/4)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		EncodeLE(p, x)
		out[r] = p
	}
	return out
}

// BenchmarkCopy is the baseline: the bytes of N shards copied (memmove) into one float32 buffer.
func BenchmarkCopy(b *testing.B) {
	for _, s := range benchShards {
		b.Run(fmt.Sprintf("N=%d,Shard=%s", benchRanks, s.name), func(b *testing.B) {
			payloads := benchPayloads(s.bytes, false)
			acc := make([]float32, s.bytes/4)
			dst := unsafe.Slice((*byte)(unsafe.Pointer(&acc[0])), s.bytes)
			b.SetBytes(int64(benchRanks * s.bytes))
			b.ReportAllocs()
			for b.Loop() {
				for _, p := range payloads {
					copy(dst, p)
				}
			}
		})
	}
}

// BenchmarkAggregate is one step of one shard: kernel=AddLE is CopyLE rank 0, AddLE ranks 1..N-1,
// Apply (the fold as messages arrive); SumLE sums all ranks at once, then Apply; FoldApply is the
// one-pass fold with the update fused. simd=off runs the portable Go loops. Its MB/s counts the N
// input shards, like BenchmarkCopy's.
func BenchmarkAggregate(b *testing.B) {
	type variant struct {
		name      string
		hyper     map[string]float64
		unaligned bool
		kernel    string
		simdOff   bool
	}
	var vs []variant
	for _, k := range []string{"AddLE", "SumLE", "FoldApply"} {
		vs = append(vs,
			variant{"sum", nil, false, k, false},
			variant{"sgd", map[string]float64{"lr": 0.01}, false, k, false},
			variant{"sgd", map[string]float64{"lr": 0.01}, true, k, false},
			variant{"adam", nil, false, k, false},
			variant{"adam", nil, true, k, false})
	}
	vs = append(vs,
		variant{"sgd", map[string]float64{"lr": 0.01}, false, "FoldApply", true},
		variant{"adam", nil, false, "FoldApply", true})
	for _, f := range vs {
		for _, s := range benchShards {
			name := fmt.Sprintf("fn=%s,N=%d,Shard=%s,kernel=%s", f.name, benchRanks, s.name, f.kernel)
			if f.unaligned {
				name += ",unaligned"
			}
			if f.simdOff {
				name += ",simd=off"
			}
			b.Run(name, func(b *testing.B) {
				defer setSIMD(!f.simdOff && haveSIMD)()
				fn := mustNew(b, f.name, f.hyper)
				payloads := benchPayloads(s.bytes, f.unaligned)
				n := s.bytes / 4
				params, acc := make([]float32, n), make([]float32, n)
				state := make([][]float32, fn.Slots())
				for i := range state {
					state[i] = make([]float32, n)
				}
				u := &Update{Params: params, Grad: acc, State: state, Ranks: benchRanks, WeightSum: benchRanks}
				b.SetBytes(int64(benchRanks * s.bytes))
				b.ReportAllocs()
				for b.Loop() {
					u.Step++
					switch f.kernel {
					case "AddLE":
						CopyLE(acc, payloads[0])
						for _, p := range payloads[1:] {
							AddLE(acc, p)
						}
						fn.Apply(u)
					case "SumLE":
						SumLE(acc, payloads)
						fn.Apply(u)
					default:
						FoldApply(fn, u, payloads)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/elem")
			})
		}
	}
}

// setSIMD sets useSIMD to on and returns the function that restores it. A test that calls it does
// not run in parallel: every test's kernels read useSIMD.
func setSIMD(on bool) func() {
	old := useSIMD
	useSIMD = on
	return func() { useSIMD = old }
}

// BenchmarkApply is the function alone, on one shard.
func BenchmarkApply(b *testing.B) {
	for _, name := range []string{"sum", "sgd", "momentum", "adam", "adagrad"} {
		for _, s := range benchShards {
			b.Run(fmt.Sprintf("fn=%s,Shard=%s", name, s.name), func(b *testing.B) {
				fn := mustNew(b, name, withLR(infoOf(name), map[string]float64{}))
				n := s.bytes / 4
				u := &Update{Params: make([]float32, n), Grad: make([]float32, n), State: make([][]float32, fn.Slots()),
					Ranks: 1, WeightSum: 1}
				for i := range u.State {
					u.State[i] = make([]float32, n)
				}
				b.SetBytes(int64(s.bytes))
				b.ReportAllocs()
				for b.Loop() {
					u.Step++
					fn.Apply(u)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/elem")
			})
		}
	}
}

// BenchmarkKernel is each kernel alone on one 1 MiB payload.
func BenchmarkKernel(b *testing.B) {
	const size = 1 << 20
	for _, unaligned := range []bool{false, true} {
		payload := benchPayloads(size, unaligned)[0]
		dst := make([]float32, size/4)
		suffix := ""
		if unaligned {
			suffix = ",unaligned"
		}
		for _, k := range []struct {
			name string
			f    func()
		}{
			{"CopyLE", func() { CopyLE(dst, payload) }},
			{"AddLE", func() { AddLE(dst, payload) }},
			{"AxpyLE", func() { AxpyLE(dst, 0.5, payload) }},
			{"EncodeLE", func() { EncodeLE(payload, dst) }},
			{"NonFinite", func() { NonFinite(payload) }},
		} {
			b.Run(k.name+",Shard=1MiB"+suffix, func(b *testing.B) {
				b.SetBytes(size)
				b.ReportAllocs()
				for b.Loop() {
					k.f()
				}
			})
		}
	}
}

func infoOf(name string) FuncInfo {
	for _, fi := range Describe() {
		if fi.Name == name {
			return fi
		}
	}
	panic(name)
}
