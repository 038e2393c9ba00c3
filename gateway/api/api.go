// Package api holds the JSON documents of the gateway's HTTP API (/v1), shared by the gateway and
// the Go SDK; gateway/openapi.json describes the same documents.
package api

import (
	"time"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Job states.
const (
	StateRunning   = "running"   // placed and training
	StatePaused    = "paused"    // paused through the API: no runtime serves it; gradients stay queued
	StateThrottled = "throttled" // paused by the gateway because it exceeded its bytes/s quota; resumes by itself
)

// Quota bounds what a job, or a team token, may use. Zero means no limit.
type Quota struct {
	Jobs           int   `json:"jobs,omitempty"`             // live jobs one team token may own
	Shards         int   `json:"shards,omitempty"`           // shards of one job
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"` // gradient bytes one job may send (or have aggregated) per second
	// StorageBytes bounds what the owner's jobs may store together: the sum of their storage
	// bounds (gradients: ranks x model x 8 steps; parameters: 2 versions of every shard and its
	// optimizer state), each fixed by its spec at creation.
	StorageBytes int64 `json:"storage_bytes,omitempty"`
}

// Credentials are NATS credentials of a job's workers. Seed (and Creds, which holds it) is a
// secret: fanin returns it once and does not keep it.
type Credentials struct {
	User        string     `json:"user"`         // the NATS user's public key
	JWT         string     `json:"jwt"`          // the user JWT
	Seed        string     `json:"seed"`         // the user's nkey seed
	Creds       string     `json:"creds"`        // JWT and seed as a .creds file (nats --creds, nats.UserCredentials)
	InboxPrefix string     `json:"inbox_prefix"` // the connection's inbox prefix (nats.CustomInboxPrefix, nats --inbox-prefix)
	Expires     *time.Time `json:"expires,omitempty"`
}

// JobCreated answers POST /v1/jobs: the job's record, a token scoped to the job, and its workers'
// NATS credentials (when the gateway runs with authentication).
type JobCreated struct {
	job.Record
	State       string       `json:"state"`
	Owner       string       `json:"owner"`
	Quota       Quota        `json:"quota"`
	Token       string       `json:"token,omitempty"`
	Credentials *Credentials `json:"credentials,omitempty"`
}

// JobStatus is a job's record and how it is doing.
type JobStatus struct {
	job.Record
	State string `json:"state"`
	Owner string `json:"owner"` // "admin" or the id of the team token that created it
	Quota Quota  `json:"quota"`
	// Step is the last step applied to every shard (the slowest shard's), -1 when not known.
	Step int64 `json:"step"`
	// StepsPerSecond is the recent training speed (the slowest shard's), 0 when idle or unknown.
	StepsPerSecond float64 `json:"steps_per_second"`
	// BytesPerSecond is the gradient bytes recently aggregated per second.
	BytesPerSecond float64 `json:"bytes_per_second"`
	Placed         int     `json:"placed"`  // shards placed on a runtime
	Rejects        int64   `json:"rejects"` // inputs rejected so far
	// LiveWorkers is how many elastic workers the job's latest assignment lists (standby ones
	// included); the record's Workers is their target. GET /v1/jobs/{id}/workers has the detail.
	LiveWorkers int `json:"live_workers"`
	// Shards is per-shard detail (GET /v1/jobs/{id} and /shards; not in listings).
	Shards []ShardStatus `json:"shards,omitempty"`
}

// ShardStatus is one shard: where it runs and how far it is.
type ShardStatus struct {
	ID      int    `json:"id"`
	Key     string `json:"key"` // <job>.<shard>, its key in the placement bucket
	Bytes   int    `json:"bytes"`
	Runtime string `json:"runtime,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"`
	Step    int64  `json:"step"` // last applied step, -1 when not known
	// Lag is how many steps the shard is behind the job's most advanced shard.
	Lag         int64   `json:"lag"`
	Pending     uint64  `json:"pending"` // gradient messages waiting for the shard's runtime
	QueueWaitMs float64 `json:"queue_wait_ms"`
	BurstMs     float64 `json:"burst_ms"`
	PeriodMs    float64 `json:"period_ms"`
}

// JobWorkers answers GET and PUT /v1/jobs/{id}/workers: the job's elastic workers and the logical
// ranks each holds, as the autoscaler leader last assigned them (wire.Assignment), and the target
// the job's record sets.
type JobWorkers struct {
	Job   string `json:"job"`
	Ranks int    `json:"ranks"` // the job's logical ranks
	// Target is the job's target worker count (job.Record.Workers): 0, every live worker holds
	// ranks; n, the first n to join do and the others stand by.
	Target int `json:"target"`
	// Epoch is the assignment's: it grows with every change of the ranks' owners. 0 when no
	// elastic worker of the job ever beat.
	Epoch   uint64 `json:"epoch"`
	Live    int    `json:"live"`    // workers listed, standby included
	Standby int    `json:"standby"` // of which standing by
	// Workers are the live workers in the order they joined; empty when no elastic worker of the
	// job ever beat.
	Workers []WorkerStatus `json:"workers"`
	// Unassigned are the ranks no live worker holds (the job has no live elastic worker).
	Unassigned []int `json:"unassigned"`
	// Updated is when the leader last wrote the assignment (it rewrites it every few seconds while
	// workers beat); absent when there is none.
	Updated *time.Time `json:"updated,omitempty"`
}

// WorkerStatus is one elastic worker: its ranks, step, last beat and how long ago that was.
type WorkerStatus struct {
	wire.AssignedWorker
	BeatAgeMs float64 `json:"beat_age_ms"` // milliseconds between its last beat and the answer
}

// WorkersRequest is the body of PUT /v1/jobs/{id}/workers.
type WorkersRequest struct {
	// Target is the job's new target worker count: 0 (every live worker holds ranks) to its ranks.
	Target *int `json:"target"`
}

// JobList answers GET /v1/jobs.
type JobList struct {
	Jobs []JobStatus `json:"jobs"`
}

// Placement is one shard's entry in the placement bucket.
type Placement struct {
	Key     string `json:"key"`
	Job     string `json:"job"`
	Shard   int    `json:"shard"`
	Runtime string `json:"runtime"`
	Epoch   uint64 `json:"epoch"`
	From    string `json:"from,omitempty"`
}

// RuntimeStatus is a runtime of the pool: its registration and its latest load report.
type RuntimeStatus struct {
	wire.RuntimeInfo
	Shards int `json:"shards"` // shards it serves (from its load report)
	// Utilization is the fraction of its cores its shards kept busy recently (sum of work/period).
	Utilization  float64    `json:"utilization"`
	NanosPerByte float64    `json:"nanos_per_byte"`
	Reported     *time.Time `json:"reported,omitempty"` // when its latest load report was received
	Placed       int        `json:"placed"`             // shards the placement bucket assigns to it
	// Node, Server and NICBytesPerSec are from its load report (wire.LoadReport): the node whose
	// NIC its shards' bytes are counted against, its NATS server, that NIC (0: unknown, no limit).
	Node           string  `json:"node,omitempty"`
	Server         string  `json:"server,omitempty"`
	NICBytesPerSec float64 `json:"nic_bytes_per_sec,omitempty"`
	// BytesInPerSec and BytesOutPerSec are its shards' gradient bytes received and parameter bytes
	// published per second.
	BytesInPerSec  float64 `json:"bytes_in_per_sec,omitempty"`
	BytesOutPerSec float64 `json:"bytes_out_per_sec,omitempty"`
}

// TargetGroup is one entry of GET /v1/metrics/targets, in the format of Prometheus's HTTP service
// discovery.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// Pool answers GET /v1/runtimes.
type Pool struct {
	Runtimes []RuntimeStatus `json:"runtimes"`
	Shards   int             `json:"shards"` // shards of all jobs
	Placed   int             `json:"placed"` // of which placed
}

// PolicyDoc answers GET and PUT /v1/policy. Policy is the autoscaler policy as JSON (durations as
// Go duration strings), YAML the same as stored.
type PolicyDoc struct {
	Policy   any        `json:"policy"`
	YAML     string     `json:"yaml"`
	Source   string     `json:"source"` // "stored" (in the fanin-policy bucket) or "default"
	Revision uint64     `json:"revision,omitempty"`
	Updated  *time.Time `json:"updated,omitempty"`
}

// PolicyRevision is one change of the policy (GET /v1/policy/history, oldest first).
type PolicyRevision struct {
	Revision uint64    `json:"revision"`
	Updated  time.Time `json:"updated"`
	Deleted  bool      `json:"deleted,omitempty"`
	Policy   any       `json:"policy,omitempty"`
	YAML     string    `json:"yaml"`
	Error    string    `json:"error,omitempty"` // when the stored document does not parse
}

// RejectRecord is one rejected input, as kept for GET /v1/jobs/{id}/rejects.
type RejectRecord struct {
	wire.Reject
	At     time.Time `json:"at"`
	Source string    `json:"source"` // runtime, gateway, nats
}

// Rejects answers GET /v1/jobs/{id}/rejects: counts by reason since the job's creation, and the
// latest rejections, oldest first.
type Rejects struct {
	Job    string                `json:"job"`
	Total  int64                 `json:"total"`
	Counts map[wire.Reason]int64 `json:"counts"`
	Recent []RejectRecord        `json:"recent"`
}

// RejectTotals answers GET /v1/rejects: counts by job and reason. Rejections that name no job are
// under "_api" (the HTTP API) and "_nats" (NATS connections fanin cannot attribute).
type RejectTotals struct {
	Jobs map[string]map[wire.Reason]int64 `json:"jobs"`
}

// Team is a team token's record (the token itself is shown once, at creation).
type Team struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Quota   Quota     `json:"quota"`
	Created time.Time `json:"created"`
	Hint    string    `json:"hint"` // the token's first characters
	Jobs    int       `json:"jobs"` // live jobs it owns
}

// TeamRequest is the body of POST /v1/tokens.
type TeamRequest struct {
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
}

// TeamCreated answers POST /v1/tokens.
type TeamCreated struct {
	Team
	Token string `json:"token"`
}

// Whoami answers GET /v1/whoami: what the caller's token is.
type Whoami struct {
	Kind string `json:"kind"` // admin, team, job, or open (the API runs without authentication)
	Team string `json:"team,omitempty"`
	Job  string `json:"job,omitempty"`
}

// Problem is an RFC 9457 problem document; Code is stable and machine-readable (a wire.Reason for
// rejected inputs).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// Move and Decision are the autoscaler's decisions, the documents of GET /v1/decisions. They are
// defined in wire, where the autoscaler publishes them, so that neither the autoscaler nor this
// package imports the other.
type (
	Move     = wire.Move
	Decision = wire.Decision
)
