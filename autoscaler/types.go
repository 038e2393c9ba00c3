package autoscaler

import (
	"time"

	"github.com/fanin-ml/fanin/wire"
)

// RuntimeObs is what the control loop observes of one runtime of the pool.
type RuntimeObs struct {
	ID       string
	Cores    int
	Since    time.Time // when it registered
	Draining bool      // being removed: it gets no new shards
	// Speed is the runtime's measured throughput relative to its peers on the same kind of work:
	// 1 is the pool's median, 0.5 half as fast. 0 means not measured yet (treated as 1).
	Speed float64
}

// ShardObs is what the control loop observes of one shard.
type ShardObs struct {
	Key     string // "<job>.<shard>", as in the placement bucket
	Job     string
	Runtime string // current owner; "" when unplaced
	Bytes   int64  // gradient bytes one step brings in (ranks x shard bytes)
	// Work is the CPU seconds one step of the shard costs on a runtime of speed 1 (measured; estimated
	// from Bytes before the first measurement).
	Work float64
	// Period is the job's step period, the time between the starts of two bursts (0: unknown).
	Period time.Duration
	// Phase is when the job's bursts start, as an offset into Period from the Unix epoch: a burst
	// starts at times t with t mod Period == Phase. Jobs whose bursts do not overlap can share cores.
	Phase time.Duration
	// Burst is how long one step's aggregation work is spread over (from the first rank's gradient
	// to the last): the window in which Work must be done for the step not to be delayed.
	Burst     time.Duration
	QueueWait time.Duration // mean time a complete step of the shard waited for a core recently
	Pending   int           // gradient messages waiting in the shard's consumer
	// Priority is the job's class (job.Spec.Priority): PriorityLow, PriorityNormal (the zero value)
	// or PriorityHigh. When the pool is at MaxRuntimes, lower classes absorb the slowdown first.
	Priority int
}

// Priority classes of ShardObs.Priority.
const (
	PriorityLow    = -1
	PriorityNormal = 0
	PriorityHigh   = 1
)

// Observations are the decider's inputs besides the policy and the time.
type Observations struct {
	Runtimes []RuntimeObs
	Shards   []ShardObs
}

// Move and Decision are the decider's output, published on wire.DecisionsSubject and served as the
// documents of the gateway's GET /v1/decisions; they are defined in wire so that the HTTP API and
// the Go SDK read them without linking the control plane.
type (
	Move     = wire.Move
	Decision = wire.Decision
)
