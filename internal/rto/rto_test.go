package rto

import (
	"testing"
	"time"
)

func TestEstimator(t *testing.T) {
	t.Parallel()
	const s = time.Second
	e := New(3*s, 8*s)
	if got := e.Timeout(); got != 3*s {
		t.Fatalf("before any answer: %v, want the floor", got)
	}
	e.Sample(100 * time.Millisecond) // a quiet link: the floor holds
	if got := e.Timeout(); got != 3*s {
		t.Fatalf("answers in 100ms: %v, want the floor", got)
	}
	// A link that fills: answers take 2 s, and then 3.
	e.Sample(2 * s)
	e.Sample(3 * s)
	if got := e.Timeout(); got <= 3*s || got > 8*s {
		t.Fatalf("answers in 2-3 s: %v, want more than the floor, at most the ceiling", got)
	}
	e.Sample(time.Minute)
	if got := e.Timeout(); got != 8*s {
		t.Fatalf("an answer in a minute: %v, want the ceiling", got)
	}
}

// A timeout doubles the timer until an answer to a message sent once comes; timeouts within one
// timer of the last are the same event.
func TestEstimatorBackoff(t *testing.T) {
	t.Parallel()
	const s = time.Second
	e := New(3*s, 30*s)
	t0 := time.Unix(1_000_000, 0)
	e.Backoff(t0)
	e.Backoff(t0.Add(10 * time.Millisecond)) // the same burst
	if got := e.Timeout(); got != 6*s {
		t.Fatalf("after one timeout: %v, want 6s", got)
	}
	e.Backoff(t0.Add(6 * s))
	if got := e.Timeout(); got != 12*s {
		t.Fatalf("after a second timeout, a timer later: %v, want 12s", got)
	}
	for i := range 5 {
		e.Backoff(t0.Add(time.Duration(20+20*i) * s))
	}
	if got := e.Timeout(); got != 30*s {
		t.Fatalf("after many: %v, want the ceiling", got)
	}
	e.Sample(4 * s) // an answer: the back-off ends, the timer follows the answers
	if got, want := e.Timeout(), 4*s+4*2*s; got != want {
		t.Fatalf("after an answer in 4s: %v, want %v", got, want)
	}
}
