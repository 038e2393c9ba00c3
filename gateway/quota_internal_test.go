package gateway

import (
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/rate"
)

// A throttle lasts what it announces: the debt has a floor, and the retries a throttled job keeps
// sending (which the NATS servers count though they refuse them) are not charged. After it, an
// idle job is not charged, however large the servers' counters it is first metered from.
func TestQuotaThrottleLastsWhatItSays(t *testing.T) {
	t.Parallel()
	const q, burst = 1000.0, 5000.0 // bytes/s, 5 s of it
	t0 := time.Unix(1000, 0)
	mt := &meter{bucket: rate.NewBucket(q, burst, burst, t0)}
	mt.recv.Delta(map[string]uint64{"n1": 0})

	// One check sees a flood far beyond the quota: throttled.
	credit := mt.charge(t0, float64(mt.recv.Delta(map[string]uint64{"n1": 1 << 30})), false)
	if credit >= 0 {
		t.Fatalf("credit %v after a flood", credit)
	}
	wait := mt.bucket.Wait(t0, burst/2)
	if wait != 7500*time.Millisecond {
		t.Fatalf("announced wait %v, want 7.5s (from one burst of debt to half a burst at the quota)", wait)
	}
	// Throttled: the job retries at 100 MB/s; the servers refuse and count it.
	var sent uint64 = 1 << 30
	now := t0
	for now.Before(t0.Add(wait - 250*time.Millisecond)) {
		now = now.Add(250 * time.Millisecond)
		sent += 25_000_000
		if credit = mt.charge(now, float64(mt.recv.Delta(map[string]uint64{"n1": sent})), true); credit >= burst/2 {
			t.Fatalf("credit %v at %v: resumed before the announced %v", credit, now.Sub(t0), wait)
		}
	}
	now = t0.Add(wait)
	sent += 25_000_000
	if credit = mt.charge(now, float64(mt.recv.Delta(map[string]uint64{"n1": sent})), true); credit < burst/2 {
		t.Fatalf("credit %v at the announced %v: still throttled by its refused retries", credit, wait)
	}

	// Resumed and idle: a server first heard from now (its answer was missing before) reports the
	// account's whole count; nothing is charged.
	for i := range 8 {
		now = now.Add(time.Second)
		got := mt.charge(now, float64(mt.recv.Delta(map[string]uint64{"n1": sent, "n2": 79_697_362})), false)
		if got < credit {
			t.Fatalf("check %d: an idle job's credit fell from %v to %v", i, credit, got)
		}
		credit = got
	}
}
