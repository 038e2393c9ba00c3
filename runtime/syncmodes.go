package runtime

import (
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/wire"
)

// SSP and ASP (docs/PROTOCOL.md, "Sync modes").
//
// SSP: a gradient of step t computed from the shard's parameters of version v is accepted when
// v < t, t-1-v <= s and version v existed when the message was stored; steps are still applied one
// by one, each the rank-order sum of its N ranks, so the parameters are a function of the
// gradients. Gradients of steps beyond the next are held (at most s+1 steps of N ranks). Every
// decision must come out the same on replay after a restore, so a snapshot records where replay
// starts (the lowest sequence of a gradient accepted and not applied: HdrReplayFrom) and which
// sequence completed each of the last s+2 steps (HdrStepSeqs): "version v existed when message q
// was stored" is "the message that completed step v came before q". Messages replayed up to the
// snapshot's own sequence were decided before: their rejections are not reported again.
//
// ASP: each accepted gradient is one update, applied at once in stream order (Ranks 1); a rank's
// steps must grow. The snapshot carries every rank's last applied step (HdrRankSteps).

// gather holds the gradients of one future step (SSP).
type gather struct {
	have    []bool
	pend    [][]byte
	dts     []wire.Dtype
	weights []float64
	seqs    []uint64
}

func newGather(n int) *gather {
	return &gather{have: make([]bool, n), pend: make([][]byte, n), dts: make([]wire.Dtype, n), weights: make([]float64, n), seqs: make([]uint64, n)}
}

func (g *gather) reset() {
	clear(g.have)
	clear(g.pend)
	clear(g.seqs)
}

// syncMode is a job's sync mode, compared on every message: a small integer, not its name.
type syncMode uint8

const (
	modeBSP syncMode = iota
	modeSSP
	modeASP
)

// syncState is the part of a shard executor's state that SSP and ASP add.
type syncState struct {
	mode      syncMode
	staleness int64
	ahead     []*gather        // ssp: ahead[k] holds step step+2+k
	curSeq    []uint64         // ssp: sequence of each rank gathered for step+1
	stepSeqs  map[int64]uint64 // ssp: the sequence that completed each of the last s+2 steps
	quietTo   uint64           // messages up to here were decided (and refusals reported) before the restore or handover
	rankSteps []int64          // asp: each rank's last applied step
	applied   string           // asp: "<rank>.<step>" of the newest update
}

func (x *shardExec) initSync(mode string, staleness int) {
	switch mode {
	case "ssp":
		x.sync.mode = modeSSP
		x.sync.staleness = int64(staleness)
		x.sync.ahead = make([]*gather, staleness)
		for i := range x.sync.ahead {
			x.sync.ahead[i] = newGather(x.ranks)
		}
		x.sync.curSeq = make([]uint64, x.ranks)
		x.sync.stepSeqs = map[int64]uint64{}
	case "asp":
		x.sync.mode = modeASP
		x.sync.rankSteps = make([]int64, x.ranks)
	}
}

// admitStep checks a gradient's step (and version) against the shard's state; nil means the
// step is acceptable. quiet is set for a message decided before the restore.
func (x *shardExec) admitStep(meta *wire.GradMeta, seq uint64) *wire.Reject {
	t, v := meta.Step, meta.Version
	switch x.sync.mode {
	case modeSSP:
		s := x.sync.staleness
		switch {
		case v < 0:
			return wire.Rejectf(wire.ReasonMissingHeader, "header %s is missing: an ssp job needs the step of the parameters each gradient was computed from", wire.HdrVersion)
		case v >= t:
			return wire.Rejectf(wire.ReasonBadHeader, "%s %d is not below step %d: a gradient of step t comes from parameters of a step before t", wire.HdrVersion, v, t)
		case t <= x.step:
			return wire.Rejectf(wire.ReasonStaleStep, "step %d was already applied (shard %d is at step %d)", t, x.shard.ID, x.step)
		case t-1-v > s:
			return wire.Rejectf(wire.ReasonFutureStep, "step %d computed from the parameters of step %d is beyond the staleness bound %d (ssp): it needs parameters of step %d or later", t, v, s, t-1-s)
		case !x.versionExisted(v, seq):
			return wire.Rejectf(wire.ReasonFutureStep, "step %d claims the parameters of step %d, which shard %d had not published when the gradient was stored", t, v, x.shard.ID)
		}
		if t > x.step+1 && x.sync.ahead[t-x.step-2].have[meta.Rank] || t == x.step+1 && x.have[meta.Rank] {
			return wire.Rejectf(wire.ReasonDuplicate, "rank %d already sent step %d of shard %d", meta.Rank, t, x.shard.ID)
		}
	case modeASP:
		switch {
		case v < 0:
			return wire.Rejectf(wire.ReasonMissingHeader, "header %s is missing: an asp job needs the step of the parameters each gradient was computed from", wire.HdrVersion)
		case v > x.step:
			return wire.Rejectf(wire.ReasonFutureStep, "the gradient claims the parameters of step %d; shard %d is at step %d", v, x.shard.ID, x.step)
		case t <= x.sync.rankSteps[meta.Rank]:
			return wire.Rejectf(wire.ReasonStaleStep, "rank %d's step %d was already applied (its last applied step on shard %d is %d; asp steps of a rank must grow)", meta.Rank, t, x.shard.ID, x.sync.rankSteps[meta.Rank])
		}
	default:
		switch {
		case t <= x.step:
			return wire.Rejectf(wire.ReasonStaleStep, "step %d was already applied (shard %d is at step %d)", t, x.shard.ID, x.step)
		case t > x.step+1:
			return wire.Rejectf(wire.ReasonFutureStep, "step %d is ahead of step %d, the next step of shard %d (bsp)", t, x.step+1, x.shard.ID)
		case x.have[meta.Rank]:
			return wire.Rejectf(wire.ReasonDuplicate, "rank %d already sent step %d of shard %d", meta.Rank, t, x.shard.ID)
		}
	}
	return nil
}

// versionExisted reports whether the shard had published version v when the message at seq was
// stored: v is applied, and the message that completed it came first (when the ring knows it).
func (x *shardExec) versionExisted(v int64, seq uint64) bool {
	if v > x.step {
		return false
	}
	if at, ok := x.sync.stepSeqs[v]; ok {
		return at < seq
	}
	return true // older than the ring: long published
}

// hold keeps a gradient of a step beyond the next (ssp).
func (x *shardExec) hold(meta *wire.GradMeta, data []byte, seq uint64) {
	g := x.sync.ahead[meta.Step-x.step-2]
	g.have[meta.Rank], g.pend[meta.Rank], g.weights[meta.Rank], g.seqs[meta.Rank] = true, data, meta.Weight, seq
	g.dts[meta.Rank] = meta.Dtype
}

// promote makes the held gradients of the new next step its gather (ssp), after apply; it
// reports whether that step is complete already.
func (x *shardExec) promote() bool {
	g := x.sync.ahead[0]
	copy(x.sync.ahead, x.sync.ahead[1:])
	x.sync.ahead[len(x.sync.ahead)-1] = g
	defer g.reset()
	clear(x.sync.curSeq)
	for r := range x.ranks {
		if g.have[r] {
			x.sync.curSeq[r] = g.seqs[r]
			x.fold(r, g.weights[r], g.dts[r], g.pend[r])
		}
	}
	return x.next == x.ranks
}

// noteApplied records, after apply, what the snapshot of the new step needs.
func (x *shardExec) noteApplied() {
	if x.sync.mode != modeSSP {
		return
	}
	x.sync.stepSeqs[x.step] = x.stepSeq
	delete(x.sync.stepSeqs, x.step-x.sync.staleness-2)
}

// replayFrom is the stream sequence a restore of the current state replays from.
func (x *shardExec) replayFrom() uint64 {
	from := x.stepSeq + 1
	if x.sync.mode != modeSSP {
		return from
	}
	// Just restored from a snapshot whose replay starts below its own sequence (held gradients),
	// and not yet replayed up to it: the messages after x.seq are not decided again yet, and some
	// are held gradients that the empty gathers below do not name (a checkpoint written now, as
	// restore writes one from an f32 parameters message, must not let them be purged).
	if x.seq < x.stepSeq {
		from = x.seq + 1
	}
	for r, h := range x.have {
		if h && x.sync.curSeq[r] > 0 {
			from = min(from, x.sync.curSeq[r])
		}
	}
	for _, g := range x.sync.ahead {
		for r, h := range g.have {
			if h {
				from = min(from, g.seqs[r])
			}
		}
	}
	return from
}

// setSyncHeaders writes what a snapshot of the current state needs beyond step and sequence.
func (x *shardExec) setSyncHeaders(h nats.Header) {
	switch x.sync.mode {
	case modeSSP:
		h.Set(wire.HdrReplayFrom, strconv.FormatUint(x.replayFrom(), 10))
		steps := make([]int64, 0, len(x.sync.stepSeqs))
		for st := range x.sync.stepSeqs {
			steps = append(steps, st)
		}
		slices.Sort(steps)
		var b strings.Builder
		for i, st := range steps {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(st, 10))
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(x.sync.stepSeqs[st], 10))
		}
		h.Set(wire.HdrStepSeqs, b.String())
	case modeASP:
		var b strings.Builder
		for r, st := range x.sync.rankSteps {
			if r > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(st, 10))
		}
		h.Set(wire.HdrRankSteps, b.String())
		if x.sync.applied != "" {
			h.Set(wire.HdrApplied, x.sync.applied)
		}
	}
}

// loadSync restores what setSyncHeaders wrote; it returns the sequence to replay from (0: the
// one after the snapshot's).
func (x *shardExec) loadSync(h nats.Header, seq uint64) (uint64, error) {
	switch x.sync.mode {
	case modeSSP:
		clear(x.sync.stepSeqs)
		for _, g := range x.sync.ahead {
			g.reset()
		}
		clear(x.sync.curSeq)
		if v := h.Get(wire.HdrStepSeqs); v != "" {
			for _, kv := range strings.Split(v, ",") {
				st, sq, ok := strings.Cut(kv, ":")
				a, err1 := strconv.ParseInt(st, 10, 64)
				b, err2 := strconv.ParseUint(sq, 10, 64)
				if !ok || err1 != nil || err2 != nil {
					return 0, errBadSnapshot(wire.HdrStepSeqs, v)
				}
				x.sync.stepSeqs[a] = b
			}
		}
		from := seq + 1
		if v := h.Get(wire.HdrReplayFrom); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 || n > seq+1 {
				return 0, errBadSnapshot(wire.HdrReplayFrom, v)
			}
			from = n
		}
		x.sync.quietTo = seq
		return from, nil
	case modeASP:
		clear(x.sync.rankSteps)
		if v := h.Get(wire.HdrRankSteps); v != "" {
			parts := strings.Split(v, ",")
			if len(parts) != x.ranks {
				return 0, errBadSnapshot(wire.HdrRankSteps, v)
			}
			for r, p := range parts {
				n, err := strconv.ParseInt(p, 10, 64)
				if err != nil {
					return 0, errBadSnapshot(wire.HdrRankSteps, v)
				}
				x.sync.rankSteps[r] = n
			}
		}
		x.sync.applied = h.Get(wire.HdrApplied)
	}
	return seq + 1, nil
}

type snapshotError struct{ header, value string }

func (e *snapshotError) Error() string {
	return "snapshot header " + e.header + ": " + strconv.Quote(e.value) + " does not parse"
}

func errBadSnapshot(header, value string) error { return &snapshotError{header, value} }

// applyOne applies one rank's gradient on its own (asp). It reports false when a user function
// failed (see apply).
func (x *shardExec) applyOne(meta *wire.GradMeta, data []byte) bool {
	w := meta.Weight
	switch {
	case x.weighted:
		functions.ScaleLE16(x.acc, float32(w), data, meta.Dtype)
	default:
		functions.CopyLE16(x.acc, data, meta.Dtype)
		w = 1
	}
	if err := functions.ApplyErr(x.fn, &functions.Update{Params: x.params, Grad: x.acc, State: x.state, Step: x.step + 1, Ranks: 1, WeightSum: w}); err != nil {
		x.functionFailed(err)
		return false
	}
	x.fnFailures = 0
	x.step++
	x.stepSeq = x.seq
	x.sync.rankSteps[meta.Rank] = meta.Step
	x.sync.applied = strconv.Itoa(meta.Rank) + "." + strconv.FormatInt(meta.Step, 10)
	x.r.stats.invocations.Add(1)
	return true
}
