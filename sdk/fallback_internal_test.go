package sdk

import (
	"testing"
	"time"
)

func TestFallbackPacing(t *testing.T) {
	t.Parallel()
	f := fallback{after: time.Second}
	began := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return began.Add(d) }
	check := func(what string, first, last, now time.Time, wantDue bool, wantLeft time.Duration) {
		t.Helper()
		due, left := f.due(began, first, last, now)
		if due != wantDue || left != wantLeft {
			t.Errorf("%s: due %v in %v, want %v in %v", what, due, left, wantDue, wantLeft)
		}
	}
	none := time.Time{}
	// Nothing learnt: WithFetchAfter after the wait began.
	check("no push, early", none, none, at(400*time.Millisecond), false, 600*time.Millisecond)
	check("no push, at WithFetchAfter", none, none, at(time.Second), true, 0)
	// Steps whose first push took 3 s: twice that before a step with no push fetches. Their pushes
	// spread over 1.5 s at most.
	f.note(3*time.Second, 500*time.Millisecond)
	f.note(time.Second, 1500*time.Millisecond)
	check("no push, learnt", none, none, at(5*time.Second), false, time.Second)
	check("no push, learnt, due", none, none, at(6*time.Second), true, 0)
	// Pushes came: WithFetchAfter after the latest, and not before twice the longest spread (3 s)
	// after the first: the pushes of a step on a slow link come in waves.
	check("pushes flowing", at(6*time.Second), at(9*time.Second), at(9500*time.Millisecond), false, 500*time.Millisecond)
	check("pushes stopped", at(8*time.Second), at(9*time.Second), at(11*time.Second), true, 0)
	check("a wave in flight", at(8*time.Second), at(8200*time.Millisecond), at(9500*time.Millisecond), false, 1500*time.Millisecond)
	check("a wave in flight, spread past", at(8*time.Second), at(8200*time.Millisecond), at(11*time.Second), true, 0)
	check("a wave just in", at(8*time.Second), at(10700*time.Millisecond), at(11*time.Second), false, 700*time.Millisecond)
	// A straggler's compute delays the first push, not the spread: a step whose first push came
	// at 20 s is due 3 s after it, not at twice its whole wait.
	check("after a straggler", at(20*time.Second), at(20*time.Second), at(23*time.Second), true, 0)
	// Never longer than maxFetchAfter, and the ring forgets.
	f.note(time.Hour, time.Hour)
	if got, got2 := f.initial(), f.spread(); got != maxFetchAfter || got2 != maxFetchAfter {
		t.Errorf("initial and spread after a step that waited an hour: %v and %v, want %v", got, got2, maxFetchAfter)
	}
	for range len(f.firsts) {
		f.note(100*time.Millisecond, 200*time.Millisecond)
	}
	if got, got2 := f.initial(), f.spread(); got != time.Second || got2 != time.Second {
		t.Errorf("initial and spread after short steps: %v and %v, want WithFetchAfter (1s)", got, got2)
	}
}
