package wire

import (
	"encoding/json"
	"regexp"
	"time"
)

// Membership of a job's physical workers (docs/PROTOCOL.md, "Elastic workers").
//
// A worker that follows the assignment (an elastic worker) publishes a WorkerBeat to
// WorkersSubject every BeatInterval, over core NATS: the job's account imports the subject as a
// service of the fanin account, so a job's credentials reach its own job's subject only. The
// autoscaler leader keeps the beats in memory, calls a worker dead once it has sent none for
// WorkerLapse, computes which worker holds which logical ranks, and writes the Assignment under
// the job's key in AssignBucket, where workers read it by a direct get.
//
// A worker holds the ranks of the newest assignment it has read. Ownership changes between steps
// need no agreement: a rank's gradient for a step is the same bytes whichever worker computes it
// (it is a function of the rank, the step and the parameters), so a rank published twice is one
// message to JetStream (same message id) and a rank nobody published yet is published by its new
// owner, which re-reads the assignment while it waits for a step.

// WorkersSubject is where the elastic workers of a job publish their WorkerBeat.
func WorkersSubject(job string) string { return Prefix + job + ".workers" }

// WorkersWildcard matches every job's WorkersSubject.
const WorkersWildcard = Prefix + "*.workers"

// AssignBucket holds, under key <job>, the job's Assignment (JSON), written by the autoscaler leader.
const AssignBucket = "fanin-assign"

// Timing of membership: a worker beats every BeatInterval and is dead after WorkerLapse without one.
const (
	BeatInterval = time.Second
	WorkerLapse  = 3 * time.Second
)

// Bounds of a beat's fields (CheckBeat). A beat beyond any is refused with ReasonBadBeat.
const (
	MaxWorkerIDLen   = 64   // the id: 1-64 of a-z, A-Z, 0-9, '_' and '-'
	MaxWorkerHostLen = 253  // the host: a DNS name or an address, of a-z, A-Z, 0-9 and . _ : % [ ] -
	MaxBeatRanks     = 4096 // the ranks listed, each in 0..MaxBeatRanks-1 (job.MaxRanks)
)

// Rates of beats the autoscaler takes; beyond them beats are dropped (ReasonBeatRate), before
// they are decoded. A worker beats once per BeatInterval; it may send WorkerBeatBurst at once and
// WorkerBeatRate a second. A job's workers together may send JobBeatRate(ranks) a second, and
// twice that at once: enough for twice as many workers as ranks, plus 16.
const (
	WorkerBeatRate  = 4
	WorkerBeatBurst = 8
)

// JobBeatRate is how many beats a second the workers of a job of ranks ranks may send.
func JobBeatRate(ranks int) float64 { return float64(2*ranks + 16) }

var (
	workerIDPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)
	hostPattern     = regexp.MustCompile(`^[a-zA-Z0-9._:%\[\]-]{0,253}$`)
)

// ValidWorkerID reports whether id can name a worker: 1-64 of a-z, A-Z, 0-9, '_' and '-'.
func ValidWorkerID(id string) bool { return workerIDPattern.MatchString(id) }

// DecodeBeat decodes and checks a beat: at most MaxBeatBytes, JSON, every field within its bounds.
// The rejection says which bound a beat broke.
func DecodeBeat(data []byte) (*WorkerBeat, *Reject) {
	if len(data) > MaxBeatBytes {
		return nil, Rejectf(ReasonBadBeat, "a beat of %d bytes: at most %d are taken", len(data), MaxBeatBytes)
	}
	var b WorkerBeat
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, Rejectf(ReasonBadBeat, "the beat does not decode: %v", err)
	}
	if rej := CheckBeat(&b); rej != nil {
		return nil, rej
	}
	return &b, nil
}

// CheckBeat says which bound of its fields a beat breaks (nil if none).
func CheckBeat(b *WorkerBeat) *Reject {
	switch {
	case !ValidWorkerID(b.ID):
		return Rejectf(ReasonBadBeat, "id %.80q: 1-%d of a-z, A-Z, 0-9, '_' and '-'", b.ID, MaxWorkerIDLen)
	case len(b.Host) > MaxWorkerHostLen:
		return Rejectf(ReasonBadBeat, "worker %s: a host of %d bytes: at most %d", b.ID, len(b.Host), MaxWorkerHostLen)
	case !hostPattern.MatchString(b.Host):
		return Rejectf(ReasonBadBeat, "worker %s: host %.80q: a DNS name or an address (a-z, A-Z, 0-9 and . _ : %% [ ] -)", b.ID, b.Host)
	case b.PID < 0:
		return Rejectf(ReasonBadBeat, "worker %s: pid %d is negative", b.ID, b.PID)
	case b.Step < -1:
		return Rejectf(ReasonBadBeat, "worker %s: step %d: at least -1 (no parameters yet)", b.ID, b.Step)
	case len(b.Ranks) > MaxBeatRanks:
		return Rejectf(ReasonBadBeat, "worker %s: %d ranks listed: at most %d", b.ID, len(b.Ranks), MaxBeatRanks)
	}
	for _, r := range b.Ranks {
		if r < 0 || r >= MaxBeatRanks {
			return Rejectf(ReasonBadBeat, "worker %s: rank %d: ranks are 0..%d", b.ID, r, MaxBeatRanks-1)
		}
	}
	return nil
}

// WorkerBeat is an elastic worker's heartbeat.
type WorkerBeat struct {
	ID   string `json:"id"`
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Step is the step of the parameters the worker holds.
	Step int64 `json:"step"`
	// Ranks are the logical ranks the worker serves now (what it has taken of the assignment).
	Ranks []int `json:"ranks"`
	// Epoch is the assignment's epoch the worker follows.
	Epoch uint64 `json:"epoch"`
	// Leaving: the worker stops after this beat; its ranks move at once.
	Leaving bool `json:"leaving,omitempty"`
}

// MaxBeatBytes bounds a WorkerBeat message (room for MaxBeatRanks ranks); larger ones are refused.
const MaxBeatBytes = 32 << 10

// Assignment says which live worker holds which logical ranks of a job.
type Assignment struct {
	Job string `json:"job"`
	// Epoch grows by one with every change of the ranks' owners.
	Epoch uint64 `json:"epoch"`
	// Target is the job's target worker count (0: every live worker); workers beyond it stand by.
	Target int `json:"target,omitempty"`
	// Workers are the live workers, in the order they joined.
	Workers []AssignedWorker `json:"workers"`
	// Unassigned are ranks no live worker holds (the job has no worker).
	Unassigned []int     `json:"unassigned,omitempty"`
	Updated    time.Time `json:"updated"`
}

// AssignedWorker is one live worker and the ranks it holds.
type AssignedWorker struct {
	ID       string    `json:"id"`
	Host     string    `json:"host,omitempty"`
	PID      int       `json:"pid,omitempty"`
	Ranks    []int     `json:"ranks"`
	Step     int64     `json:"step"`
	Joined   time.Time `json:"joined"`
	LastBeat time.Time `json:"last_beat"`
	// Standby: live but beyond the target worker count; it holds no ranks.
	Standby bool `json:"standby,omitempty"`
}

// RanksOf returns the ranks the assignment gives worker id (nil if none).
func (a *Assignment) RanksOf(id string) []int {
	for _, w := range a.Workers {
		if w.ID == id {
			return w.Ranks
		}
	}
	return nil
}
