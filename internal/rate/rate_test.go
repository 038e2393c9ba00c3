package rate

import (
	"testing"
	"time"
)

func TestSteps(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	var s Steps
	if s.Rate() != 0 || !s.LastAdvance().IsZero() {
		t.Fatalf("empty: rate %v, last advance %v", s.Rate(), s.LastAdvance())
	}
	s.Add(t0, 5)
	s.Add(t0.Add(200*time.Millisecond), 6)
	if r := s.Rate(); r != 0 {
		t.Fatalf("over 200 ms: rate %v, want 0 (too short to tell)", r)
	}
	for i := 2; i <= 30; i++ { // one step a second for 30 s, sampled every second
		s.Add(t0.Add(time.Duration(i)*time.Second), int64(5+i))
	}
	if r := s.Rate(); r != 1 {
		t.Fatalf("rate %v, want 1 step/s", r)
	}
	if n := len(s.marks); n != 11 {
		t.Fatalf("%d samples kept, want the 11 within the 10 s window", n)
	}
	for i := 31; i <= 35; i++ { // stalled for 5 s
		s.Add(t0.Add(time.Duration(i)*time.Second), 35)
	}
	if got, want := s.LastAdvance(), t0.Add(30*time.Second); !got.Equal(want) {
		t.Fatalf("last advance %v, want %v", got, want)
	}
	if r := s.Rate(); r != 0.5 {
		t.Fatalf("rate over a window half stalled %v, want 0.5", r)
	}
	for i := 36; i <= 60; i++ {
		s.Add(t0.Add(time.Duration(i)*time.Second), 35)
	}
	if r, adv := s.Rate(), s.LastAdvance(); r != 0 || !adv.IsZero() {
		t.Fatalf("stalled for a whole window: rate %v, last advance %v", r, adv)
	}
}
