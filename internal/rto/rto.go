// Package rto tells how long to wait for an answer before sending a message again, from the round
// trips of the answers that came: the smoothed round trip and its variation of TCP's
// retransmission timer (RFC 6298), within a floor and a ceiling.
//
// A fixed timeout shorter than a full link's queue has every message sent again behind itself,
// and the copies fill the queue further: at 25 Mbit/s a shard's parameters, acknowledged 3-5 s
// after they were published, were published again after 3 s, and a worker's gradients, answered
// 5-10 s after they were sent, again after 5 s. A timeout that follows what the answers take
// waits that long instead; the floor keeps it where the fixed timeout was on a quiet link, so a
// message lost there is sent again as soon as before.
//
// As in TCP, only the answer to a message sent once is a sample (Karn's rule: an answer to a
// message sent twice may answer either copy), and a timeout backs the timer off (twice as long, up
// to the ceiling) until an answer to a message sent once comes: otherwise a link whose every
// message times out would never be learnt.
package rto

import (
	"sync"
	"time"
)

// Estimator is a retransmission timer shared by the messages of one sender. It is safe for
// concurrent use.
type Estimator struct {
	floor, ceil time.Duration

	mu        sync.Mutex
	sampled   bool          // a round trip has been sampled
	srtt, dev time.Duration // smoothed round trip and its mean deviation
	backoff   time.Duration // the backed-off timeout (0: none): the timeout until the next sample
	backedAt  time.Time     // when it was last backed off
}

// New returns an estimator whose timeout is floor until answers say more, and ceil at most.
func New(floor, ceil time.Duration) *Estimator {
	return &Estimator{floor: floor, ceil: max(floor, ceil)}
}

// Sample records the round trip of an answer to a message sent once, and ends a back-off.
func (e *Estimator) Sample(rtt time.Duration) {
	if rtt < 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.sampled {
		e.sampled, e.srtt, e.dev = true, rtt, rtt/2
	} else {
		e.dev = (3*e.dev + (e.srtt - rtt).Abs()) / 4
		e.srtt = (7*e.srtt + rtt) / 8
	}
	e.backoff = 0
}

// Timeout is how long to wait for the answer to a message sent now.
func (e *Estimator) Timeout() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.timeout()
}

func (e *Estimator) timeout() time.Duration {
	if e.backoff > 0 {
		return e.backoff
	}
	return min(e.ceil, max(e.floor, e.srtt+4*e.dev))
}

// Backoff doubles the timeout, up to the ceiling, after a message got no answer in its time at
// now. Messages sent together time out together: a back-off within one timeout of the last is the
// same event, and does not double it again.
func (e *Estimator) Backoff(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.timeout()
	if e.backoff > 0 && now.Sub(e.backedAt) < cur {
		return
	}
	e.backoff, e.backedAt = min(e.ceil, 2*cur), now
}
