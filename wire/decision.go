package wire

import "time"

// Move takes one shard from one runtime to another.
type Move struct {
	Shard  string `json:"shard"`
	From   string `json:"from"` // "" for a shard that was unplaced
	To     string `json:"to"`
	Reason string `json:"reason"`
}

// Decision is one decision of the autoscaler, published on DecisionsSubject (and served as the
// documents of the gateway's GET /v1/decisions): the pool size it wants and where every shard
// should run.
type Decision struct {
	At      time.Time `json:"at"`
	Desired int       `json:"desired"` // runtimes wanted in the pool
	// Placement maps every observed shard to the runtime it should run on; only runtimes that were
	// observed and are not in Drain appear in it.
	Placement map[string]string `json:"placement"`
	Moves     []Move            `json:"moves"`   // the changes against the observed placement
	Drain     []string          `json:"drain"`   // runtimes to remove once empty
	Mode      string            `json:"mode"`    // "stable" or "panic"
	Demand    float64           `json:"demand"`  // cores the load needs at its peak (the basis of Desired)
	Reasons   []string          `json:"reasons"` // why, in words a platform team can read
}
