package functions

import (
	"fmt"
	"slices"
	"strconv"
)

// Range is one shard's slice of the flattened parameter vector.
type Range struct{ Off, Len int }

// Reference computes in one process what any deployment must reproduce bit for bit: per shard,
// the ranks' inputs summed in float32 in rank order 0..N-1 (weighted for fedavg), then the
// function. It sums with Add (Scale/Axpy when weighted), which give the same bits as the
// runtime's CopyLE/AddLE (ScaleLE/AxpyLE) on the encoded inputs, and it calls the same Apply.
// A Reference is not safe for concurrent use.
type Reference struct {
	fn       Func
	weighted bool
	ranks    int
	shards   []Range
	params   []float32
	state    [][][]float32 // per shard, Slots() vectors
	scratch  []float32     // the sum of one shard
	step     int64
	updates  []int64 // per shard, ApplyRank's updates
}

// NewReference returns the reference for fn with ranks logical ranks, parameters init (copied)
// cut into shards. An empty shards means one shard covering init. Shards must lie within init
// and must not overlap; elements outside every shard never change. It panics on bad arguments.
func NewReference(fn Func, ranks int, shards []Range, init []float32) *Reference {
	if ranks < 1 {
		panic("functions: NewReference: ranks " + strconv.Itoa(ranks) + " < 1")
	}
	if len(shards) == 0 {
		shards = []Range{{0, len(init)}}
	}
	shards = slices.Clone(shards)
	sorted := slices.Clone(shards)
	slices.SortFunc(sorted, func(a, b Range) int { return a.Off - b.Off })
	end, longest := 0, 0
	for _, s := range sorted {
		if s.Off < end || s.Len < 0 || s.Off+s.Len > len(init) {
			panic("functions: NewReference: shard {" + strconv.Itoa(s.Off) + ", " + strconv.Itoa(s.Len) +
				"} overlaps another or lies outside the " + strconv.Itoa(len(init)) + " parameters")
		}
		end = s.Off + s.Len
		longest = max(longest, s.Len)
	}
	r := &Reference{
		fn: fn, weighted: IsWeighted(fn), ranks: ranks, shards: shards,
		params: slices.Clone(init), state: make([][][]float32, len(shards)),
		scratch: make([]float32, longest),
	}
	if r.params == nil {
		r.params = []float32{}
	}
	for i, s := range shards {
		st := make([][]float32, fn.Slots())
		for j := range st {
			st[j] = make([]float32, s.Len)
		}
		if err := InitStateErr(fn, st); err != nil {
			panic("functions: NewReference: " + err.Error())
		}
		r.state[i] = st
	}
	return r
}

// Step applies one step. grads[r] is rank r's full flattened gradient (or model, for fedavg).
// weights may be nil (all 1) and is used only when the function is weighted; then every rank's
// input is scaled by float32(weights[r]) and WeightSum is SumWeights(weights). It panics when a
// Fallible function fails (TryStep returns the error).
func (r *Reference) Step(grads [][]float32, weights []float64) {
	if err := r.TryStep(grads, weights); err != nil {
		panic("functions: Reference.Step: " + err.Error())
	}
}

// TryStep is Step returning a Fallible function's failure instead of panicking. The step is then
// not counted, and the shards before the failing one keep their update: a Reference that failed
// is of no further use but to report the failure.
func (r *Reference) TryStep(grads [][]float32, weights []float64) error {
	if len(grads) != r.ranks {
		panic("functions: Reference.Step: " + strconv.Itoa(len(grads)) + " gradients for " + strconv.Itoa(r.ranks) + " ranks")
	}
	for i, g := range grads {
		if len(g) != len(r.params) {
			panic("functions: Reference.Step: rank " + strconv.Itoa(i) + " gradient has " + strconv.Itoa(len(g)) +
				" elements, want " + strconv.Itoa(len(r.params)))
		}
	}
	weightSum := float64(r.ranks)
	if r.weighted && weights != nil {
		if len(weights) != r.ranks {
			panic("functions: Reference.Step: " + strconv.Itoa(len(weights)) + " weights for " + strconv.Itoa(r.ranks) + " ranks")
		}
		weightSum = SumWeights(weights)
	} else {
		weights = nil
	}
	r.step++
	for i, s := range r.shards {
		acc := r.scratch[:s.Len]
		for rank, g := range grads {
			x := g[s.Off : s.Off+s.Len]
			switch {
			case weights != nil && rank == 0:
				Scale(acc, float32(weights[0]), x)
			case weights != nil:
				Axpy(acc, float32(weights[rank]), x)
			case rank == 0:
				copy(acc, x)
			default:
				Add(acc, x)
			}
		}
		if err := ApplyErr(r.fn, &Update{
			Params: r.params[s.Off : s.Off+s.Len], Grad: acc, State: r.state[i],
			Step: r.step, Ranks: r.ranks, WeightSum: weightSum,
		}); err != nil {
			r.step--
			return fmt.Errorf("step %d, shard %d: %w", r.step+1, i, err)
		}
	}
	return nil
}

// ApplyRank applies one rank's gradient to one shard on its own, as an asp job's runtime does:
// Update.Step is the shard's count of updates (ApplyRank's, not Step's), Ranks 1, and the input
// is the rank's gradient (weighted functions: scaled by float32(weight), WeightSum weight). grad
// is the full flattened gradient; only the shard's slice is read.
func (r *Reference) ApplyRank(shard int, grad []float32, weight float64) {
	if shard < 0 || shard >= len(r.shards) {
		panic("functions: Reference.ApplyRank: no shard " + strconv.Itoa(shard))
	}
	if len(grad) != len(r.params) {
		panic("functions: Reference.ApplyRank: gradient has " + strconv.Itoa(len(grad)) + " elements, want " + strconv.Itoa(len(r.params)))
	}
	if r.updates == nil {
		r.updates = make([]int64, len(r.shards))
	}
	s := r.shards[shard]
	acc, x := r.scratch[:s.Len], grad[s.Off:s.Off+s.Len]
	w := 1.0
	if r.weighted {
		w = weight
		Scale(acc, float32(w), x)
	} else {
		copy(acc, x)
	}
	r.updates[shard]++
	if err := ApplyErr(r.fn, &Update{
		Params: r.params[s.Off : s.Off+s.Len], Grad: acc, State: r.state[shard],
		Step: r.updates[shard], Ranks: 1, WeightSum: w,
	}); err != nil {
		panic("functions: Reference.ApplyRank: " + err.Error())
	}
}

// Params returns the current parameters. The slice is owned by the Reference and changes with
// every Step.
func (r *Reference) Params() []float32 { return r.params }

// StepCount returns the number of steps applied so far (the last Update.Step).
func (r *Reference) StepCount() int64 { return r.step }
