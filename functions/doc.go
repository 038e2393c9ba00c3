// Package functions holds fanin's aggregation functions, their registry, and the single-process
// reference semantics that every deployment reproduces bit for bit.
//
// # The contract
//
// One step of one shard is: the N ranks' inputs are summed in float32, in rank order 0..N-1,
// into an accumulator (CopyLE rank 0 then AddLE ranks 1..N-1; for a weighted function such as
// fedavg, ScaleLE rank 0 then AxpyLE ranks 1..N-1 with w = float32(weight[r])); then the
// function's Apply is called once with that sum as Update.Grad. Reference does exactly this in
// one process; the runtime does it over JetStream; both must give the same bits.
//
// A rank's input may arrive as 16-bit floats (Fanin-Dtype bf16 or f16, wire.BF16 and wire.F16):
// each element is first converted to float32 exactly (wire.BF16ToF32, wire.F16ToF32: both formats
// are subsets of binary32), then summed as above, so ranks and steps may mix dtypes. The result is
// Reference's for the converted inputs: a caller that starts from float32 and rounds with
// wire.F32ToBF16 or wire.F32ToF16 (round to nearest even, overflow to Inf) feeds Reference
// wire.Round of its gradients. Parameters, state and the arithmetic stay float32.
//
// What the workers receive of the parameters is not part of this contract: a job with
// param_dtype bf16 (job.Spec.ParamDtype) publishes, after step 0, its float32 parameters rounded
// to bfloat16 (wire.Encode with wire.BF16: nearest even), but the parameters the functions update,
// checkpoint and restore are the float32 ones, bit for bit those of Reference. A worker of such a
// job computes its gradients from wire.Round(Reference.Params(), wire.BF16); fed those gradients,
// Reference gives the service's float32 parameters exactly.
//
// Let scale = float32(1/WeightSum) (WeightSum is N, or for a weighted function the float64 sum of
// the weights in rank order, see SumWeights). A weight is a float64: on the wire, the header's
// decimal read as the nearest float64 (wire.ParseGradHeaders, strconv.ParseFloat with 64 bits;
// absent, 1). The inputs are scaled by float32 of that float64, and WeightSum adds the float64s
// themselves, not their float32 roundings: ((w0 + w1) + w2) + ... in float64. 1/WeightSum is
// computed in float64 and rounded once. Every optimizer sees the mean gradient
//
//	g[i] = float32(Grad[i] * scale)
//
// (sum sees g[i] = Grad[i], unscaled). Every function accepts clip_norm (default 0, off): when it
// is > 0, norm = sqrt(sum of float64(g[i])^2, accumulated in float64 in index order), and when
// norm > clip_norm, g[i] = float32(g[i] * float32(clip_norm/norm)). Clipping is per shard, so
// with clip_norm the result depends on the shard layout (which is a pure function of the job).
//
// The functions, with p = Params[i], float32 arithmetic throughout and sqrt(x) meaning
// float32(math.Sqrt(float64(x))), the correctly rounded float32 square root:
//
//	sum       p = g                                   (g not scaled by 1/WeightSum)
//	mean      p = g
//	fedavg    p = g                                   (Weighted: g is the weighted mean)
//	sgd       d = g + wd*p;  p = p - lr*d
//	momentum  d = g + wd*p
//	          v = d                                   at Step 1 (PyTorch clones d into the buffer)
//	          v = mu*v + (1-dampening)*d              later steps
//	          d = d + mu*v if nesterov, else d = v;  p = p - lr*d
//	nesterov  momentum with nesterov = 1
//	adam      g = g + wd*p
//	          m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*(g*g)
//	          denom = sqrt(v)/sqrt(bc2) + eps;  p = p - (lr/bc1)*(m/denom)
//	adamw     p = p*(1-lr*wd) first, then adam without the L2 term
//	adagrad   g = g + wd*p;  s = s + g*g;  p = p - lr*(g/(sqrt(s)+eps))
//
// The weight-decay term is skipped entirely when weight_decay is 0 (as PyTorch does), which
// matters only for signed zeros and non-finite parameters. Scalars derived from hyper-parameters
// are computed in float64 and rounded once: 1-b1, 1-b2, 1-dampening, 1-lr*wd, and per Apply
// bc1 = 1-b1^t, bc2 = 1-b2^t (b^t by binary exponentiation: multiplications only, in a fixed
// order, rather than math.Pow), lr/bc1 and sqrt(bc2).
// Every product is written with an explicit float32(...) conversion: the Go spec allows the
// compiler to fuse x*y+z into one FMA instruction (it does so on arm64, ppc64, s390x, riscv64),
// and an explicit conversion forbids that, so amd64 and arm64 give identical bits. The golden test
// checks it: run under qemu on arm64, it fails as soon as one conversion is removed
// (FANIN_QEMU=1 go test -run TestUnderQemu ./functions runs it on arm64, ppc64le, riscv64, s390x).
//
// # Sync modes
//
// bsp and ssp jobs apply the contract above once per step: ssp only lets a worker compute a step
// from older parameters (which gradients come in is the workers' business; what is done with them
// is not), so Reference.Step, given the same gradients, gives the same bits. In an asp job every
// gradient is an update of its own, applied to its shard in the order the shard's gradients were
// stored: Update.Grad is that one rank's input (weighted functions: scaled by float32(weight),
// WeightSum = weight, so the mean is the input again; others: the input, WeightSum 1), Ranks is 1,
// and Update.Step is the shard's count of updates so far, not a worker's step, so Adam's bias
// correction and momentum's first step follow the shard's updates. Reference.ApplyRank does it.
//
// # Hyper-parameters
//
// Names, defaults and ranges (GET /v1/functions serves the same table; an unknown name, a missing
// required one, or a value out of range or beyond float32's range is refused at job creation).
// Every function also takes clip_norm (default 0: off, >= 0).
//
//	function  hyper-parameter      default  range     kept as
//	sum, mean, fedavg              -
//	sgd       lr                   required > 0       float32
//	          weight_decay         0        >= 0      float32
//	momentum  lr                   required > 0       float32
//	          momentum             0.9      [0, 1)    float32 (mu)
//	          dampening            0        [0, 1);   float32(1 - dampening), rounded once
//	                                        0 when nesterov = 1 (refused otherwise, as PyTorch does)
//	          weight_decay         0        >= 0      float32
//	          nesterov             0        0 or 1
//	nesterov  as momentum, with nesterov = 1 and no nesterov key: dampening must be 0
//	adam      lr                   0.001    > 0       float64: step = float32(lr/bc1)
//	          beta1, beta2         0.9, 0.999 [0, 1)  float32 in m and v; float32(1-beta) rounded
//	                                                  once; float64 in bc = 1-beta^t
//	          eps                  1e-8     > 0       float32
//	          weight_decay         0        >= 0      float32 (L2, added to g)
//	adamw     as adam, but weight_decay defaults to 0.01 and is decoupled:
//	          decay = float32(1 - lr*weight_decay), the product in float64, rounded once
//	adagrad   lr                   0.01     > 0       float32
//	          eps                  1e-10    > 0       float32
//	          weight_decay         0        >= 0      float32
//	          initial_accumulator  0        >= 0      float32
//	all       clip_norm            0        >= 0      float64: c = float32(clip_norm/norm)
//
// "float32" means float32(value) once, at configuration. The initial state (Func.InitState,
// before step 1): momentum's buffer v, adam's m and v are zero (momentum then takes v = d at step
// 1, as PyTorch clones d into the buffer); adagrad's sum s is initial_accumulator. A shard's state
// is part of its checkpoint; a new owner restores it.
//
// b^t (adam's bias corrections, t the step) is computed in float64 by binary exponentiation,
// from the lowest bit of t up: r = 1; for each bit of t: if the bit is 1 { r = r*b }; b = b*b.
// Each product is one float64 multiplication, so the result is the same bits everywhere.
//
// # Kernels
//
// CopyLE, AddLE, ScaleLE, AxpyLE, EncodeLE and NonFinite work on the wire's raw little-endian
// float32 bytes; Add, Scale and Axpy are their float32 counterparts, which the Reference uses;
// every pair gives the same bits. SumLE sums N payloads at once, with the bits of CopyLE + AddLE
// in rank order, for a runtime that has gathered every rank. FoldApply is SumLE then Apply in one
// pass (sgd, momentum, nesterov, adam, adamw and adagrad without clip_norm: a 4096-element block
// is summed, then updated while it is in the L1 cache; sum, mean and fedavg, and clip_norm > 0,
// which needs the norm of the whole gradient first, sum everything and then apply); AddApply is the last AddLE then Apply, in one
// pass where FoldApply has one, for a runtime that folds the ranks as they arrive. None of them
// allocates.
//
// On amd64 with AVX2 (detected at start-up) the sums and every function's loop run in assembly
// (simd_amd64.s) on 8 float32s per instruction, reading payloads at any alignment in place. Each
// element still gets the same float32 operations in the same order as the Go loops (the sum
// across ranks is vertical: element i is ((x0[i] + x1[i]) + x2[i]) + ...), every vector
// operation used (add, subtract, multiply, divide, square root) is correctly rounded like its
// scalar form, and no FMA instruction is used, so the results are the bits of the scalar
// definition. The only freedom is IEEE 754's: when two NaNs meet, which payload the result keeps
// (the Go compiler may also swap the operands of a commutative scalar operation). Elsewhere, and
// on amd64 without AVX2, the kernels are the portable Go loops.
package functions
