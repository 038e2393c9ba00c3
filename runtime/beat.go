package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

// Heartbeats ride the same NATS routes as the data. Behind a full link a heartbeat can take
// seconds to reach the registry's leader and as long to be acknowledged; with one heartbeat at a
// time the registry's stamps would then come a round trip apart, and every component would take a
// live runtime for dead and move its shards away. So a runtime sends a heartbeat every period
// without waiting for the last (up to maxBeatsInFlight unanswered: they are small, and a
// registration outlives none of them), and asks for a longer lapse while its heartbeats are slow
// (store.LapseFor), or while its other messages' acknowledgements are: the judges hear of its
// heartbeats late too.

// maxBeatsInFlight bounds the heartbeats sent and not yet answered: a period's worth of them over
// the registry's TTL, after which one is no use.
const maxBeatsInFlight = int(store.RuntimeTTL / store.RuntimeHeartbeat)

// beatWindow is how long a slow heartbeat keeps the lapse the runtime asks for raised: the links
// of a training job fill at every step, so a runtime that was slow a step ago will be again.
const beatWindow = time.Minute

// beatMeter keeps the heartbeats in flight and the recent round trips of the answered ones, and of
// the runtime's other messages observed.
type beatMeter struct {
	mu       sync.Mutex
	inFlight map[uint64]time.Time // by sequence number: when each was sent
	next     uint64
	recent   []beatSample // answered, given up on or observed within beatWindow, oldest first
}

type beatSample struct {
	at  time.Time     // when it was answered
	rtt time.Duration // from its sending
}

func newBeatMeter() *beatMeter { return &beatMeter{inFlight: map[uint64]time.Time{}} }

// send records a heartbeat sent at now and returns its number, or false if maxBeatsInFlight are
// unanswered already: then none is sent.
func (m *beatMeter) send(now time.Time) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.inFlight) >= maxBeatsInFlight {
		return 0, false
	}
	m.next++
	m.inFlight[m.next] = now
	return m.next, true
}

// done records that heartbeat n was answered at now, or given up on (counted as answered then:
// it took that long at least).
func (m *beatMeter) done(n uint64, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sent, ok := m.inFlight[n]
	if !ok {
		return
	}
	delete(m.inFlight, n)
	m.recent = append(m.recent, beatSample{at: now, rtt: now.Sub(sent)})
}

// observe records the round trip of another message of the runtime's through the same NATS
// routes (a publish's acknowledgement). Behind a full link the data's acknowledgements are slow
// before a heartbeat is, and the heartbeats after them will be: the lapse asked for follows them
// too.
func (m *beatMeter) observe(now time.Time, rtt time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recent = append(m.recent, beatSample{at: now, rtt: rtt})
}

// worst is the longest round trip of the heartbeats answered (and of the messages observed) within
// beatWindow of now, or the age of the oldest unanswered heartbeat if it is longer.
func (m *beatMeter) worst(now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := 0
	for i < len(m.recent) && now.Sub(m.recent[i].at) > beatWindow {
		i++
	}
	m.recent = m.recent[i:]
	var w time.Duration
	for _, s := range m.recent {
		w = max(w, s.rtt)
	}
	for _, sent := range m.inFlight {
		w = max(w, now.Sub(sent))
	}
	return w
}

// lapse is the lapse the runtime asks for at now: the default, or longer after slow heartbeats.
func (m *beatMeter) lapse(now time.Time) time.Duration { return store.LapseFor(m.worst(now)) }

// register writes the runtime's registration, the lapse it asks for included.
func (r *Runtime) register(ctx context.Context, started time.Time) error {
	now := r.now()
	info, _ := json.Marshal(wire.RuntimeInfo{ID: r.id, Cores: r.cores, Started: started.UTC(), Beat: now.UTC(),
		Lapse: r.beats.lapse(now), Metrics: r.metricsURL})
	if err := r.putBeat(ctx, r.id, info); err != nil {
		return fmt.Errorf("register runtime %s: %w", r.id, err)
	}
	return nil
}

// putRegistration is the default putBeat: a write of the registry.
func (r *Runtime) putRegistration(ctx context.Context, id string, info []byte) error {
	_, err := r.buckets.Runtimes.Put(ctx, id, info)
	return err
}

// beat sends a heartbeat every period until ctx ends, each on its own (see above), and waits for
// the unanswered ones before it returns. Each is given the registry's TTL.
func (r *Runtime) beat(ctx context.Context, started time.Time) {
	t := time.NewTicker(r.heartbeat)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n, ok := r.beats.send(r.now())
			if !ok {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				bctx, cancel := context.WithTimeout(ctx, store.RuntimeTTL)
				err := r.register(bctx, started)
				cancel()
				r.beats.done(n, r.now())
				if err != nil && ctx.Err() == nil {
					r.log.Warn("heartbeat failed", "err", err)
				}
			}()
		}
	}
}
