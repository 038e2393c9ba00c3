package runtime

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/natstest"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

// The lapse a runtime asks for follows its heartbeats' round trips: the longest answered within
// beatWindow, or the age of the oldest unanswered one; no more than maxBeatsInFlight go out
// unanswered.
func TestBeatMeter(t *testing.T) {
	t.Parallel()
	m := newBeatMeter()
	t0 := time.Unix(1_000_000, 0)
	if got := m.lapse(t0); got != store.RuntimeLapse {
		t.Fatalf("no heartbeat yet: lapse %v, want %v", got, store.RuntimeLapse)
	}
	a, _ := m.send(t0)
	b, _ := m.send(t0.Add(time.Second))
	m.done(a, t0.Add(300*time.Millisecond))
	if got := m.worst(t0.Add(500 * time.Millisecond)); got != 300*time.Millisecond {
		t.Fatalf("one answered in 300ms: worst %v", got)
	}
	if got := m.lapse(t0.Add(time.Second + 500*time.Millisecond)); got != store.RuntimeLapse {
		t.Fatalf("fast heartbeats: lapse %v, want the default", got)
	}
	// b is unanswered for 4 s: the lapse is raised before it is answered.
	at := t0.Add(5 * time.Second)
	if got, want := m.lapse(at), store.LapseFor(4*time.Second); got != want || got <= store.RuntimeLapse {
		t.Fatalf("a heartbeat unanswered for 4s: lapse %v, want %v", got, want)
	}
	m.done(b, at)
	m.done(b, at.Add(time.Second)) // twice: ignored
	if got := m.worst(at.Add(beatWindow)); got != 4*time.Second {
		t.Fatalf("within the window of the slow one: worst %v, want 4s", got)
	}
	if got := m.lapse(at.Add(beatWindow + time.Millisecond)); got != store.RuntimeLapse {
		t.Fatalf("the slow heartbeat a window ago: lapse %v, want the default", got)
	}
	// A publish's acknowledgement 3 s late, through the same routes: the lapse follows it.
	later := at.Add(2 * beatWindow)
	m.observe(later, 3*time.Second)
	if got, want := m.lapse(later.Add(time.Second)), store.LapseFor(3*time.Second); got != want || got <= store.RuntimeLapse {
		t.Fatalf("an acknowledgement 3s late: lapse %v, want %v", got, want)
	}
	if got := store.LapseFor(time.Minute); got != store.MaxRuntimeLapse {
		t.Fatalf("a minute's round trip: lapse %v, want the most, %v", got, store.MaxRuntimeLapse)
	}
	for i := range maxBeatsInFlight {
		if _, ok := m.send(at.Add(time.Duration(i) * time.Second)); !ok {
			t.Fatalf("heartbeat %d of %d refused", i+1, maxBeatsInFlight)
		}
	}
	if _, ok := m.send(at.Add(time.Hour)); ok {
		t.Fatalf("%d heartbeats unanswered, another one sent", maxBeatsInFlight)
	}
}

// Heartbeats that reach the registry later and later, as behind a link that fills (each is
// delayed before it is written, so the registry stamps it late), leave the runtime alive to a
// judge reading the registry all along: they go out every period without waiting for the last,
// and the registration asks for a longer lapse. With one heartbeat at a time, the stamps come a
// round trip apart, and the runtime was taken for dead once the delay passed 4 s: the heartbeat
// after one delayed 4 s came 5 s after it.
func TestLateHeartbeatsKeepTheRuntimeAlive(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	r, err := New(nc, WithLogger(slog.New(slog.NewTextHandler(t.Output(), nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if r.buckets, err = store.OpenBuckets(ctx, r.js); err != nil {
		t.Fatal(err)
	}
	// The k-th heartbeat is delayed k seconds, 6 at most.
	const most = 6 * time.Second
	var sent, on, mostOn atomic.Int64 // heartbeats sent; on their way now, and the most at once
	put := r.putBeat
	r.putBeat = func(ctx context.Context, id string, info []byte) error {
		n := on.Add(1)
		defer on.Add(-1)
		for m := mostOn.Load(); n > m && !mostOn.CompareAndSwap(m, n); m = mostOn.Load() {
		}
		d := min(most, time.Duration(sent.Add(1)-1)*time.Second)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
		return put(ctx, id, info)
	}
	started := time.Now()
	if err := r.register(ctx, started); err != nil {
		t.Fatal(err)
	}
	go r.beat(ctx, started)

	// The judge: the registration as stored, by the liveness rule, every 50 ms, until 4 heartbeats
	// delayed the most were sent and stored.
	deadline, until := time.Now().Add(time.Minute), time.Time{}
	var info wire.RuntimeInfo
	for until.IsZero() || time.Now().Before(until) {
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats sent in a minute", sent.Load())
		}
		if until.IsZero() && sent.Load() >= int64(most/time.Second)+4 {
			until = time.Now().Add(most + time.Second)
		}
		e, err := r.buckets.Runtimes.Get(ctx, r.id)
		if err != nil {
			t.Fatalf("%d heartbeats sent: %v", sent.Load(), err)
		}
		if err := json.Unmarshal(e.Value(), &info); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); !store.RuntimeAlive(e.Created(), info.Lapse, now) {
			t.Fatalf("taken for dead after %d heartbeats: the last stored %v ago, its lapse %v",
				sent.Load(), now.Sub(e.Created()).Round(time.Millisecond), store.Lapse(info.Lapse))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Delays up to 6 periods: several heartbeats were on their way at once.
	if n := mostOn.Load(); n < 3 {
		t.Fatalf("at most %d heartbeats on their way at once, want 3 or more", n)
	}
	if info.Lapse <= store.RuntimeLapse {
		t.Fatalf("heartbeats delayed %v: the registration asks for a lapse of %v, want more than %v", most, info.Lapse, store.RuntimeLapse)
	}
}
