package rate

import "time"

// Bucket is a token bucket with a floor: it fills at Rate tokens per second up to Burst, and a
// charge may take it into debt, but never below -Floor, so that a debt, and the wait it means
// (Wait), stays bounded whatever is charged. Time is an argument of every call (tests pass it).
// The zero value is empty; New returns a full one. It is not safe for concurrent use.
type Bucket struct {
	Rate  float64 // tokens per second
	Burst float64 // the most it holds
	Floor float64 // the most debt it holds (>= 0)

	level float64
	last  time.Time
}

// NewBucket returns a full bucket.
func NewBucket(rate, burst, floor float64, now time.Time) *Bucket {
	return &Bucket{Rate: rate, Burst: burst, Floor: floor, level: burst, last: now}
}

// Level refills the bucket up to now and returns what it holds (negative: a debt).
func (b *Bucket) Level(now time.Time) float64 {
	if b.last.IsZero() || now.Before(b.last) { // the clock went back: refill from now on
		b.last = now
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.level = min(b.Burst, b.level+b.Rate*dt.Seconds())
		b.last = now
	}
	b.level = min(b.level, b.Burst) // Burst may have been lowered
	return b.level
}

// Charge takes n tokens, into debt if need be (down to -Floor), and returns the level after.
func (b *Bucket) Charge(now time.Time, n float64) float64 {
	b.level = max(-b.Floor, b.Level(now)-n)
	return b.level
}

// Allow takes n tokens if the bucket holds them, and says whether it did.
func (b *Bucket) Allow(now time.Time, n float64) bool {
	if b.Level(now) < n {
		return false
	}
	b.level -= n
	return true
}

// Wait is how long the bucket takes to hold level again (0 if it does; forever at rate 0).
func (b *Bucket) Wait(now time.Time, level float64) time.Duration {
	have := b.Level(now)
	if have >= level {
		return 0
	}
	if b.Rate <= 0 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration((level - have) / b.Rate * float64(time.Second))
}

// Counters turns samples of monotonic counters, one per source (a NATS server's count of the
// bytes it received from an account, say), into how much they grew. The zero value is ready.
type Counters struct {
	last map[string]uint64
}

// Delta records a sample and returns how much the counters grew since the previous ones. A source
// seen for the first time is a baseline and adds nothing (its counter holds what came before
// metering began); a source missing from a sample keeps its last value (a server that did not
// answer in time has not lost its count); a counter that went down was restarted and counts from
// zero.
func (c *Counters) Delta(sample map[string]uint64) uint64 {
	if c.last == nil {
		c.last = map[string]uint64{}
	}
	var total uint64
	for src, n := range sample {
		prev, seen := c.last[src]
		switch {
		case !seen:
		case n >= prev:
			total += n - prev
		default:
			total += n
		}
		c.last[src] = n
	}
	return total
}
