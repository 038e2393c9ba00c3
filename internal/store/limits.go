package store

import (
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// StorageWindow is how many steps of a job's gradients its stream may hold at once: the step being
// gathered, steps not yet purged behind the last snapshot (a checkpoint every few steps, purged
// asynchronously), and gradients published early. Beyond it, JetStream refuses new gradients
// (DiscardNew) until the runtimes purge: a publish error, never an eviction.
const StorageWindow = 8

// GradWindow is how many steps of gradients a job's stream may hold: StorageWindow, and for an ssp
// job with staleness s, s+1 more. A runtime holds up to s steps beyond the one it gathers, and
// keeps every gradient from the lowest one it holds (replay starts there), so a worker s steps
// ahead of a slow one legitimately keeps s+1 steps in the stream; with less room, the fast
// workers' held gradients would fill the stream and the slow worker could never publish the step
// that unblocks them.
func GradWindow(spec *job.Spec) int64 {
	w := int64(StorageWindow)
	if spec.Sync == "ssp" {
		w += int64(spec.Staleness) + 1
	}
	return w
}

// MaxGradHeaders bounds the headers of one gradient message (step, rank, dtype, weight, message id,
// reply subject, trace context): the stream refuses a message larger than its shard plus this.
const MaxGradHeaders = 4 << 10

// GradMaxMsgSize is the largest gradient message a job's stream accepts: its largest shard plus
// headers. A runtime's consumer must be able to pull one (runtime.shardExec.serve).
func GradMaxMsgSize(rec *job.Record) int32 {
	largest := 0
	for _, s := range rec.Layout.Shards {
		largest = max(largest, s.Bytes())
	}
	return int32(largest + MaxGradHeaders)
}

// JobStorageBound is what a job's streams may store: grad, its gradients (ranks x the model's bytes
// x GradWindow, plus headers); params, its parameter stream (ParamsHistory versions of every
// shard's parameters and checkpoints with their optimizer state, plus headers). Parameters are
// counted as f32 (a param_dtype bf16 job's are half that after step 0, its step 0 is f32), and
// every shard has room for checkpoints: a stateless shard of a bf16 job writes them too (its f32
// parameters, the one vector its parameters messages no longer hold exactly).
func JobStorageBound(rec *job.Record) (grad, params int64) {
	slots := 0
	if n, err := rec.Spec.FuncSlots(); err == nil {
		slots = n
	}
	for _, s := range rec.Layout.Shards {
		b := int64(s.Bytes())
		grad += int64(rec.Spec.Ranks) * (b + MaxGradHeaders)
		paramsMsg := b + wire.Headroom
		ckptMsg := int64(1+slots)*b + wire.Headroom
		params += int64(ParamsHistory) * (paramsMsg + ckptMsg)
	}
	return grad * GradWindow(&rec.Spec), params
}

// ParamsHistory is how many versions of each shard's parameters (and checkpoints) the parameter
// stream keeps: two, so that a worker that joins or restarts while a step is half applied can read
// every shard at the same step (in BSP no two shards are more than one step apart).
const ParamsHistory = 2
