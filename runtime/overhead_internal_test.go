package runtime

import (
	"testing"
	"time"
)

// The overhead is the process's CPU over the shards' work between readings: stretches with too
// little work are skipped (their CPU is counted with the next), the ratio is kept within 1 and
// maxOverhead, and smoothed.
func TestOverheadFollowsTheProcessCPUPerWork(t *testing.T) {
	ms := int64(time.Millisecond)
	var o overhead
	o.start(0, 0)
	o.observe(5*time.Millisecond, 1*ms) // too little work: nothing yet
	if o.factor != 0 {
		t.Fatalf("after 1 ms of work: %v, want 0 (unmeasured)", o.factor)
	}
	o.observe(90*time.Millisecond, 30*ms) // 90 ms of CPU for 30 ms of work, the skipped stretch included
	if o.factor != 3 {
		t.Fatalf("90 ms of CPU over 30 ms of work: %v, want 3", o.factor)
	}
	o.observe(110*time.Millisecond, 60*ms) // 20 ms of CPU for 30 ms of work: at least 1
	if want := ewma(3, 1); o.factor != want {
		t.Fatalf("less CPU than work: %v, want %v (1 averaged in)", o.factor, want)
	}
	var p overhead
	p.start(0, 0)
	p.observe(10*time.Second, 20*ms) // a mostly idle process's CPU: at most maxOverhead
	if p.factor != maxOverhead {
		t.Fatalf("10 s of CPU over 20 ms of work: %v, want %v", p.factor, maxOverhead)
	}
}
