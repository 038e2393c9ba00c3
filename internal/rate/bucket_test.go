package rate

import (
	"testing"
	"time"
)

// A debt is bounded by the floor, so the wait it means is too, however much is charged.
func TestBucketFloor(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	b := NewBucket(100, 500, 500, t0)
	if got := b.Charge(t0, 300); got != 200 {
		t.Fatalf("level after 300 of 500: %v", got)
	}
	for range 100 {
		b.Charge(t0, 1e9)
	}
	if got := b.Level(t0); got != -500 {
		t.Fatalf("level after charging 1e11: %v, want the floor -500", got)
	}
	if w := b.Wait(t0, 250); w != 7500*time.Millisecond {
		t.Fatalf("wait for 250 from -500 at 100/s: %v", w)
	}
	if got := b.Level(t0.Add(7500 * time.Millisecond)); got != 250 {
		t.Fatalf("level 7.5 s later: %v", got)
	}
	if got := b.Level(t0.Add(time.Hour)); got != 500 {
		t.Fatalf("level an hour later: %v, want the burst", got)
	}
}

func TestBucketAllow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	b := NewBucket(2, 3, 0, t0)
	n := 0
	for range 10 {
		if b.Allow(t0, 1) {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("allowed %d of 10 at once, want the burst 3", n)
	}
	if b.Allow(t0.Add(400*time.Millisecond), 1) {
		t.Fatal("allowed one 0.4 s later at 2/s")
	}
	if !b.Allow(t0.Add(500*time.Millisecond), 1) {
		t.Fatal("refused one 0.5 s later at 2/s")
	}
}

// A source first seen is a baseline, however large its counter and whether or not an earlier
// sample was empty; a source missing from a sample keeps its count; a restarted one counts from 0.
func TestCountersDelta(t *testing.T) {
	t.Parallel()
	var c Counters
	for i, tc := range []struct {
		sample map[string]uint64
		want   uint64
	}{
		{map[string]uint64{}, 0}, // no server answered
		{map[string]uint64{"a": 79_697_362}, 0},
		{map[string]uint64{"a": 79_697_362, "b": 5_000}, 0},
		{map[string]uint64{"a": 79_698_362}, 1000}, // b did not answer
		{map[string]uint64{"a": 79_698_362, "b": 5_100}, 100},
		{map[string]uint64{"a": 200, "b": 5_100}, 200}, // a restarted
		{nil, 0},
	} {
		if got := c.Delta(tc.sample); got != tc.want {
			t.Fatalf("sample %d %v: delta %d, want %d", i, tc.sample, got, tc.want)
		}
	}
}
