package sdk

import "time"

// maxFetchAfter bounds how long a waiting worker goes without fetching from the stream.
const maxFetchAfter = 10 * time.Second

// fallback paces a waiting worker's fetches from the parameters stream. Parameters are pushed;
// a fetch is for a push that is really missing, not merely late, or the shard's bytes reach the
// worker twice: a worker on a slow link whose pushes took longer than WithFetchAfter used to
// fetch every shard still in flight, and received about twice its parameters per step. A push is
// taken as missing when
//   - the connection reconnected or the subscription dropped messages while the worker waited
//     (whatever was pushed in between is lost): at once;
//   - pushes of the step arrived and then stopped for WithFetchAfter;
//   - no push of the step arrived at all for twice the longest recent wait for a step's first
//     push, and at least WithFetchAfter (a step's first push waits for the slowest rank and the
//     aggregation, which WithFetchAfter alone does not know).
//
// Fetches back off from there, to maxFetchAfter apart. fallback is used by the Step goroutine
// only.
type fallback struct {
	after  time.Duration    // WithFetchAfter
	firsts [8]time.Duration // recent waits for a step's first push, a ring
	next   int
}

// initial is how long a worker waits for a step's first push before it fetches.
func (f *fallback) initial() time.Duration {
	var longest time.Duration
	for _, d := range f.firsts {
		longest = max(longest, d)
	}
	return min(max(2*longest, f.after), maxFetchAfter)
}

// note records how long a step waited for its first push.
func (f *fallback) note(d time.Duration) {
	f.firsts[f.next] = d
	f.next = (f.next + 1) % len(f.firsts)
}

// due reports whether a worker that began waiting at began, whose latest push of the step arrived
// at last (zero if none did), should fetch at now; if not, how long until it looks again.
func (f *fallback) due(began, last, now time.Time) (bool, time.Duration) {
	if last.IsZero() {
		if left := f.initial() - now.Sub(began); left > 0 {
			return false, left
		}
		return true, 0
	}
	if left := f.after - now.Sub(last); left > 0 {
		return false, left
	}
	return true, 0
}
