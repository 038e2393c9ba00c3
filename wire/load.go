package wire

import "time"

// LoadSubject is where a runtime publishes its LoadReport every second (core NATS).
func LoadSubject(runtime string) string { return Prefix + "load." + runtime }

// LoadWildcard matches every runtime's load reports.
const LoadWildcard = Prefix + "load.*"

// HandoverBucket holds, per shard (key <job>.<shard>), the release written by the shard's previous
// owner once its final snapshot is stored: the new owner starts only after it, or after the previous
// owner died.
const HandoverBucket = "fanin-handover"

// LeaderBucket holds the autoscaler's leader lock.
const LeaderBucket = "fanin-leader"

// PolicyBucket holds the autoscaler policy (key "policy", YAML or JSON).
const PolicyBucket = "fanin-policy"

// DecisionsSubject carries every autoscaler decision (JSON), kept by stream DecisionsStream;
// DecisionsFence, in the same stream, the leadership term that may publish them.
const (
	DecisionsSubject = Prefix + "decisions"
	DecisionsFence   = Prefix + "decisions-fence"
	DecisionsStream  = "FANIN_DECISIONS"
)

// RuntimeStopSubject is where the autoscaler leader asks a runtime to stop (core NATS request,
// header Fanin-Term: its leadership term): the runtime checkpoints and releases its shards,
// deregisters and exits, whoever started it. It answers "stopping", or why not. The subject is in
// fanin's account and exported to no job, so only fanin's components can send it.
func RuntimeStopSubject(runtime string) string { return Prefix + "runtimes." + runtime + ".stop" }

// RuntimeStopping is a runtime's answer to a stop request it obeys.
const RuntimeStopping = "stopping"

// LoadReport is a runtime's view of its own load.
//
// Node, Server and NICBytesPerSec came later than the rest: a report without them (from an older
// runtime) decodes with them zero, which reads as a node of its own with a NIC that is no limit.
type LoadReport struct {
	Runtime string    `json:"runtime"`
	Cores   int       `json:"cores"`
	At      time.Time `json:"at"`
	// NanosPerByte is the recent time the runtime spent per aggregated gradient byte (fold and
	// function): its speed, comparable across runtimes for the same kind of work.
	NanosPerByte float64 `json:"nanos_per_byte"`
	// Node is the machine the runtime runs on, whose network interface its shards' bytes cross:
	// the operator's label (fanin runtime --node), else Server. Runtimes with one Node share one NIC.
	Node string `json:"node,omitempty"`
	// Server is the name of the NATS server the runtime is connected to (the server_name that
	// JetStream names stream leaders by).
	Server string `json:"server,omitempty"`
	// NICBytesPerSec is the node's network bandwidth each way, in bytes per second: the operator's
	// (--nic-bandwidth) or the link speed the kernel reports. 0 means unknown: not a limit.
	NICBytesPerSec float64 `json:"nic_bytes_per_sec,omitempty"`
	// Overhead is the runtime process's recent CPU time per second of its shards' Work (at least
	// 1), less what the process spends with no work at all: what else it spends to do that work
	// (reading its connection, decoding, the garbage collector), which a shard's Work, its kernels'
	// time, leaves out. The autoscaler plans a shard at Work x Overhead. 0: not measured (a runtime
	// sharing its process with other components, as in fanin dev, or an older runtime), taken as 1.
	Overhead float64     `json:"overhead,omitempty"`
	Shards   []ShardLoad `json:"shards"`
}

// ShardLoad is one shard's recent load, as averages over its last steps.
type ShardLoad struct {
	Key   string  `json:"key"` // <job>.<shard>
	Job   string  `json:"job"`
	Step  int64   `json:"step"`  // last applied step
	Bytes int64   `json:"bytes"` // gradient bytes per step (ranks x shard)
	Work  float64 `json:"work"`  // CPU seconds per step
	// Apply is the part of Work in the shard's update, done once a step when its last gradient
	// is summed (the function; a user function's can be most of the work); the rest is the sums.
	Apply     float64       `json:"apply,omitempty"`
	Period    time.Duration `json:"period"`
	Phase     time.Duration `json:"phase"` // burst start modulo Period, from the Unix epoch
	Burst     time.Duration `json:"burst"` // first to last gradient of a step
	QueueWait time.Duration `json:"queue_wait"`
	Pending   uint64        `json:"pending"` // messages the consumer had not yet delivered
	// BytesInPerSec is the gradient bytes the shard received per second (its bytes per step over
	// its step period), BytesOutPerSec the parameter bytes it published per second: measured over
	// its recent steps, 0 before its period is known or from a runtime too old to report them.
	BytesInPerSec  float64 `json:"bytes_in_per_sec,omitempty"`
	BytesOutPerSec float64 `json:"bytes_out_per_sec,omitempty"`
}

// Handover is a shard's release by its previous owner.
type Handover struct {
	Epoch    uint64    `json:"epoch"` // the placement epoch that moved the shard away
	From     string    `json:"from"`
	Step     int64     `json:"step"` // the step of the final snapshot
	Stopped  time.Time `json:"stopped"`
	Released time.Time `json:"released"`
	// Decided is the stream sequence of the last gradient message the previous owner decided on
	// (applied, held or refused). The new owner replays from the snapshot and decides those again,
	// the same way; it does not report a refusal of one up to here again: the previous owner did.
	// An owner that never served the shard passes on the record of the owner before it.
	Decided uint64 `json:"decided,omitempty"`
}
