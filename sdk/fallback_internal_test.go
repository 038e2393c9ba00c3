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
	f.note(3 * time.Second)
	f.note(time.Second)
	check("no push, learnt", time.Time{}, at(5*time.Second), false, time.Second)
	check("no push, learnt, due", time.Time{}, at(6*time.Second), true, 0)
	// Pushes came: WithFetchAfter after the latest, however long the step has waited.
	check("pushes flowing", at(9*time.Second), at(9500*time.Millisecond), false, 500*time.Millisecond)
	check("pushes stopped", at(9*time.Second), at(10*time.Second), true, 0)
	// Never longer than maxFetchAfter, and the ring forgets.
	f.note(time.Hour)
	if got := f.initial(); got != maxFetchAfter {
		t.Errorf("initial after a step that waited an hour: %v, want %v", got, maxFetchAfter)
	}
	for range len(f.firsts) {
		f.note(100 * time.Millisecond)
	}
	if got := f.initial(); got != time.Second {
		t.Errorf("initial after short steps: %v, want WithFetchAfter (1s)", got)
	}
}
