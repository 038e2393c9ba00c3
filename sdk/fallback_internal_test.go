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
	check := func(what string, last, now time.Time, wantDue bool, wantLeft time.Duration) {
		t.Helper()
		due, left := f.due(began, last, now)
		if due != wantDue || left != wantLeft {
			t.Errorf("%s: due %v in %v, want %v in %v", what, due, left, wantDue, wantLeft)
		}
	}
	// Nothing learnt: WithFetchAfter after the wait began.
	check("no push, early", time.Time{}, at(400*time.Millisecond), false, 600*time.Millisecond)
	check("no push, at WithFetchAfter", time.Time{}, at(time.Second), true, 0)
	// Steps whose first push took 3 s: twice that before a step with no push fetches.
	f.note(3*time.Second, 3500*time.Millisecond)
	f.note(time.Second, 1500*time.Millisecond)
	check("no push, learnt", time.Time{}, at(5*time.Second), false, time.Second)
	check("no push, learnt, due", time.Time{}, at(6*time.Second), true, 0)
	// Pushes came: WithFetchAfter after the latest, and not before twice the longest whole wait
	// (3.5 s): the pushes of a step on a slow link come in waves.
	check("pushes flowing", at(9*time.Second), at(9500*time.Millisecond), false, 500*time.Millisecond)
	check("pushes stopped", at(9*time.Second), at(10*time.Second), true, 0)
	check("a wave in flight", at(2*time.Second), at(3*time.Second), false, 4*time.Second)
	check("a wave in flight, whole wait past", at(2*time.Second), at(7*time.Second), true, 0)
	check("a wave just in", at(6500*time.Millisecond), at(7*time.Second), false, 500*time.Millisecond)
	// Never longer than maxFetchAfter, and the ring forgets.
	f.note(time.Hour, time.Hour)
	if got := f.initial(); got != maxFetchAfter {
		t.Errorf("initial after a step that waited an hour: %v, want %v", got, maxFetchAfter)
	}
	if got := f.whole(); got != maxFetchAfter {
		t.Errorf("whole after a step that waited an hour: %v, want %v", got, maxFetchAfter)
	}
	for range len(f.firsts) {
		f.note(100*time.Millisecond, 200*time.Millisecond)
	}
	if got, got2 := f.initial(), f.whole(); got != time.Second || got2 != time.Second {
		t.Errorf("initial and whole after short steps: %v and %v, want WithFetchAfter (1s)", got, got2)
	}
}
