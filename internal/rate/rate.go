// Package rate is fanin's one estimator of training speed: steps per second from (time, step)
// samples over a sliding window. The gateway (a job's status, `fanin jobs`, `fanin top`) and the
// dashboard both use it, so they agree. It also holds the token bucket (Bucket) that meters the
// bytes/s quota and the elastic workers' beats, and Counters, which turns samples of monotonic
// counters into increments.
package rate

import "time"

// Window is how far back a rate looks.
const Window = 10 * time.Second

// minSpan is the shortest span of samples a rate is given for: less is noise.
const minSpan = 500 * time.Millisecond

// Steps holds a stream's recent (time, step) samples, oldest first, within Window of the newest
// (and at least two). The zero value is ready to use; it is not safe for concurrent use.
type Steps struct {
	marks []mark
}

type mark struct {
	at   time.Time
	step int64
}

// Add records that the stream was at step at time at. Samples must come in time order.
func (s *Steps) Add(at time.Time, step int64) {
	s.marks = append(s.marks, mark{at, step})
	drop := 0
	for len(s.marks)-drop > 2 && at.Sub(s.marks[drop+1].at) >= Window {
		drop++
	}
	if drop > 0 {
		s.marks = append(s.marks[:0], s.marks[drop:]...)
	}
}

// Rate is the steps per second between the oldest and the newest sample, 0 with fewer than two
// samples or over less than half a second.
func (s *Steps) Rate() float64 {
	if len(s.marks) < 2 {
		return 0
	}
	a, b := s.marks[0], s.marks[len(s.marks)-1]
	dt := b.at.Sub(a.at)
	if dt < minSpan {
		return 0
	}
	return float64(b.step-a.step) / dt.Seconds()
}

// LastAdvance is when the step last changed (the zero time if it did not within the window).
func (s *Steps) LastAdvance() time.Time {
	for i := len(s.marks) - 1; i > 0; i-- {
		if s.marks[i].step != s.marks[i-1].step {
			return s.marks[i].at
		}
	}
	return time.Time{}
}

// Last is the newest sample's time (zero if none).
func (s *Steps) Last() time.Time {
	if len(s.marks) == 0 {
		return time.Time{}
	}
	return s.marks[len(s.marks)-1].at
}
