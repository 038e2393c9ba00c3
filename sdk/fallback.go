package sdk

import "time"

// maxFetchAfter bounds how long a waiting worker goes without fetching from the stream.
const maxFetchAfter = 10 * time.Second

// fallback paces a waiting worker's fetches from the parameters stream. Parameters are pushed;
// a fetch is for a push that is really missing, not merely late, or the shard's bytes reach the
// worker twice. A push is taken as missing when
//   - the connection reconnected or the subscription dropped messages while the worker waited
//     (whatever was pushed in between is lost): at once;
//   - no push of the step arrived at all for twice the longest recent wait for a step's first
//     push, and at least WithFetchAfter (a step's first push waits for the slowest rank and the
//     aggregation, which WithFetchAfter alone does not know);
//   - pushes of the step arrived, then none for WithFetchAfter, and twice the longest recent
//     spread of a step's pushes (its last push's time after its first) has passed since this
//     step's first push.
//
// The spread is for slow links: the pushes of a step come in waves, a node's shards at a time as
// each node's gradients complete, and on a link of 100 Mbit/s a wave came more than a second
// after the one before. Pushes merely in flight were fetched, their bytes came twice, the step
// took longer and the next fetched more (the cluster bench's spread cases: 3-5 fetches per worker
// in 5 steps). The spread starts at the first push, so a straggler's compute, which delays every
// push alike, does not lengthen it.
//
// A fetch takes the missing shards one after another and stops at the first whose stream has
// not got the step yet: its push is to come, and most likely the others' too; fetching them all
// brought a whole step's parameters again on a slow link (the cluster bench's service-node case,
// whose pushes trickle out of one node's link: up to 13 fetches per worker in 5 steps). After a
// reconnect or a dropped message it takes them all: pushes may be gone.
//
// Fetches back off from there, to maxFetchAfter apart. fallback is used by the Step goroutine
// only: a direct-gradient job's sender reads what it needs (stall) before it starts.
type fallback struct {
	after   time.Duration    // WithFetchAfter
	firsts  [8]time.Duration // recent waits for a step's first push, a ring
	spreads [8]time.Duration // recent spreads of a step's pushes, the same ring
	next    int
}

// initial is how long a worker waits for a step's first push before it fetches.
func (f *fallback) initial() time.Duration { return f.bound(f.firsts[:]) }

// spread is how long after a step's first push its last may come.
func (f *fallback) spread() time.Duration { return f.bound(f.spreads[:]) }

// bound is twice the longest of recent waits, at least WithFetchAfter and at most maxFetchAfter.
func (f *fallback) bound(waits []time.Duration) time.Duration {
	var longest time.Duration
	for _, d := range waits {
		longest = max(longest, d)
	}
	return min(max(2*longest, f.after), maxFetchAfter)
}

// note records how long a step waited for its first push, and how long after it its last came.
func (f *fallback) note(first, spread time.Duration) {
	f.firsts[f.next], f.spreads[f.next] = first, spread
	f.next = (f.next + 1) % len(f.firsts)
}

// due reports whether a worker that began waiting at began, whose first and latest pushes of the
// step arrived at first and last (zero if none did), should fetch at now; if not, how long until
// it looks again.
func (f *fallback) due(began, first, last, now time.Time) (bool, time.Duration) {
	left := f.initial() - now.Sub(began)
	if !last.IsZero() {
		left = max(f.after-now.Sub(last), f.spread()-now.Sub(first))
	}
	if left > 0 {
		return false, left
	}
	return true, 0
}
