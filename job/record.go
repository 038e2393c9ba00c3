package job

import "time"

// Record is what fanin stores for a job (JetStream KV bucket fanin-jobs, key = job id). Workers in any
// language read it to learn the layout: `nats kv get fanin-jobs <job>`.
type Record struct {
	Spec    Spec      `json:"spec"`
	Layout  Layout    `json:"layout"`
	Created time.Time `json:"created"`
	// Paused: the job stays known (workers may join and publish; their gradients queue in its
	// stream) but the autoscaler places none of its shards, so no runtime serves it.
	Paused bool `json:"paused,omitempty"`
	// Workers is the target count of the job's elastic workers (0: every live worker holds ranks);
	// live workers beyond it stand by (wire.Assignment).
	Workers int `json:"workers,omitempty"`
}

// NewRecord derives the record of a validated spec.
func NewRecord(s Spec, now time.Time) Record {
	return Record{Spec: s, Layout: s.Layout(), Created: now.UTC()}
}
