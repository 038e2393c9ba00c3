package runtime

import (
	"testing"
	"time"
)

// The overhead is the process's CPU over the shards' work from one reading to the next, less what
// the process spends with no work at all (learnt from the intervals without work): intervals with
// too little work are skipped, the ratio is kept within 1 and maxOverhead, and smoothed.
func TestOverheadFollowsTheProcessCPUPerWork(t *testing.T) {
	ms := int64(time.Millisecond)
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var o overhead
	o.start(0, 0, at(0))
	o.observe(5*time.Millisecond, 1*ms, at(1)) // too little work: nothing
	if o.factor != 0 {
		t.Fatalf("after 1 ms of work: %v, want 0 (unmeasured)", o.factor)
	}
	o.observe(95*time.Millisecond, 31*ms, at(2)) // 90 ms of CPU for 30 ms of work
	if o.factor != 3 {
		t.Fatalf("90 ms of CPU over 30 ms of work: %v, want 3", o.factor)
	}
	o.observe(105*time.Millisecond, 31*ms, at(4)) // no work for 2 s: 5 ms of CPU per second, idle
	if o.factor != 3 || o.idle != 0.005 {
		t.Fatalf("an idle interval: factor %v, idle %v; want 3 and 0.005", o.factor, o.idle)
	}
	// 1 s with 40 ms of work and 125 ms of CPU: 5 ms of it is the process's own, 120 for the work.
	o.observe(230*time.Millisecond, 71*ms, at(5))
	if want := ewma(3, 3); o.factor != want {
		t.Fatalf("with the idle CPU taken off: %v, want %v", o.factor, want)
	}
	o.observe(240*time.Millisecond, 101*ms, at(6)) // 10 ms of CPU for 30 ms of work: at least 1
	if want := ewma(3, 1); o.factor != want {
		t.Fatalf("less CPU than work: %v, want %v (1 averaged in)", o.factor, want)
	}
	var p overhead
	p.start(0, 0, at(0))
	p.observe(time.Second, 20*ms, at(1)) // a busy process with little work: at most maxOverhead
	if p.factor != maxOverhead {
		t.Fatalf("1 s of CPU over 20 ms of work: %v, want %v", p.factor, maxOverhead)
	}
}
