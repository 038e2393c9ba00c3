package autoscaler

import (
	"strings"
	"testing"
	"time"
)

// The closed loop reaches placement, not only the pool size: a small job that queues behind a big
// one on the same runtime (the "small job waiting behind a big job's batch") misses its
// budget, its headroom grows until the runtime no longer holds both in the model, and its shards
// move to the idle runtime. Open loop, the runtime looks fine (2.9 of its 3.2 cores) and nothing
// moves.
func TestDecideFeedbackMovesAJobThatQueues(t *testing.T) {
	t.Parallel()
	build := func() Observations {
		big := steady("big", 8, 2.5, "rt-1")
		for i := range big {
			big[i].QueueWait = 15 * time.Millisecond // 1.5%: inside its budget, not well inside
		}
		small := steady("small", 2, 0.4, "rt-1")
		for i := range small {
			small[i].QueueWait = 80 * time.Millisecond // 8% of its 1 s step
		}
		return Observations{Runtimes: runtimes(2), Shards: append(big, small...)}
	}
	for _, tc := range []struct {
		budget float64
		moved  bool
	}{{0, false}, {0.02, true}} {
		p := DefaultPolicy()
		p.SlowdownBudget, p.HeadroomPeriod = tc.budget, 0
		p.MinRuntimes = 2 // the idle runtime stays: this is about placement
		obs := build()
		d := NewDecider()
		moved := false
		for i := range 12 {
			dec := d.Decide(p, obs, at(time.Duration(i)*time.Second))
			checkPlacement(t, obs, dec)
			for _, m := range dec.Moves {
				if m.From != "" {
					if !strings.HasPrefix(m.Shard, "small.") || m.To != "rt-2" {
						t.Errorf("budget %v: move %+v, want the small job's shards to rt-2", tc.budget, m)
					}
					moved = true
				}
			}
			apply(&obs, dec)
		}
		if moved != tc.moved {
			t.Errorf("budget %v: the small job moved %v, want %v (headroom %v)", tc.budget, moved, tc.moved, d.Headroom())
		}
	}
}
