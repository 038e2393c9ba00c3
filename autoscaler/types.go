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
	// Node is the machine the runtime runs on: runtimes of one Node share its NIC. "" means not
	// known: the runtime counts as a node of its own.
	Node string
	// Server is the NATS server the runtime is connected to, as JetStream names a stream's leader.
	Server string
	// NIC is the node's bandwidth each way in bytes per second; 0 means unknown: not a limit.
	NIC float64
	// Unreported: no load report from the runtime yet, so its Node and NIC are not known yet (a
	// runtime that just started). While another runtime's NIC is known it gets no new shards: taken
	// for a node without a limit, it would draw a NIC-bound job's shards onto itself.
	Unreported bool
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
	// BytesIn and BytesOut are the bytes per second the shard brings into its runtime's node (the
	// ranks' gradients) and takes out of it (its parameters, once for each rank's worker), counted
	// against the node's NIC. 0 means not measured: estimated as Bytes per step over the period
	// (Policy.UnknownBurst while that is unknown).
	BytesIn, BytesOut float64
	// Leader is the NATS server leading the job's parameter stream ("" unknown): a runtime
	// connected to it publishes the parameters without a hop, so among equal choices placement
	// prefers it.
	Leader string
	// GradLeader is the NATS server leading the stream of the shard's gradients when its job has
	// several (spec gradient_streams; "" otherwise, or unknown): every gradient of the shard is
	// stored there, and a runtime connected to another server takes each across the network again.
	// Placement puts the shard on a runtime connected to it where one has room.
	GradLeader string
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
