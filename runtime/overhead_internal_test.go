package runtime

import (
	"testing"
	"time"
)

// The overhead is the process's CPU over the shards' work from one reading to the next, less what
// the process spends with no work at all (the least rate seen in the intervals without work):
// the first interval (the start's restores) is not read, intervals with too little work are
// skipped, each ratio is kept within 1 and maxOverhead, and the overhead is the median of the last
// few, which one interval of a shard's restore does not move.
func TestOverheadFollowsTheProcessCPUPerWork(t *testing.T) {
	ms := int64(time.Millisecond)
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var o overhead
	o.start(0, 0, at(0))
	o.observe(900*time.Millisecond, 30*ms, at(1)) // the start: not read
	if o.factor != 0 {
		t.Fatalf("after the first interval: %v, want 0 (unmeasured)", o.factor)
	}
	o.observe(905*time.Millisecond, 31*ms, at(2)) // 1 ms of work: too little
	if o.factor != 0 {
		t.Fatalf("after 1 ms of work: %v, want 0 (unmeasured)", o.factor)
	}
	o.observe(995*time.Millisecond, 61*ms, at(3)) // 90 ms of CPU for 30 ms of work
	if o.factor != 3 {
		t.Fatalf("90 ms of CPU over 30 ms of work: %v, want 3", o.factor)
	}
	o.observe(1005*time.Millisecond, 61*ms, at(5)) // no work for 2 s: 5 ms of CPU per second, idle
	o.observe(1105*time.Millisecond, 61*ms, at(6)) // no work, 100 ms: a step's tail, not idle
	if o.factor != 3 || o.idle != 0.005 {
		t.Fatalf("idle intervals: factor %v, idle %v; want 3 and the least, 0.005", o.factor, o.idle)
	}
	// 1 s with 40 ms of work and 125 ms of CPU: 5 ms of it is the process's own, 120 for the work.
	o.observe(1230*time.Millisecond, 101*ms, at(7))
	if o.factor != 3 {
		t.Fatalf("with the idle CPU taken off: %v, want 3", o.factor)
	}
	// A shard restored: 1 s of CPU for 30 ms of work, clamped to maxOverhead, and the median of
	// 3, 3 and 10 is still 3.
	o.observe(2235*time.Millisecond, 131*ms, at(8))
	if o.factor != 3 {
		t.Fatalf("after one interval of a restore: %v, want the median 3", o.factor)
	}
	o.observe(2245*time.Millisecond, 161*ms, at(9)) // 10 ms of CPU for 30 ms of work: at least 1
	if o.factor != 3 {
		t.Fatalf("median of 3, 3, 10, 1: %v, want 3", o.factor)
	}
	o.observe(2255*time.Millisecond, 191*ms, at(10))
	o.observe(2265*time.Millisecond, 221*ms, at(11))
	if o.factor != 1 {
		t.Fatalf("the last five 3, 10, 1, 1, 1: %v, want 1", o.factor)
	}
}
