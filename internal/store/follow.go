package store

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A Watcher follows the keys of a bucket like jetstream's KeyWatcher (the current values, a nil
// entry, then every change) and heals: nats.go's watch goes silent for good when its server
// restarts or the bucket's stream is recreated or loses its leader at the wrong moment, and says
// nothing. A Watcher checks the stream every CheckInterval and, when the stream was recreated or
// holds a change the watch has not delivered for a whole interval, opens a new watch (with
// backoff while that fails) and re-syncs: it delivers the current values again and a delete for
// every key that vanished meanwhile, so a follower's mirror ends up equal to the bucket. A
// re-sync's deletes carry revision math.MaxUint64, newer than anything seen; after a recreation
// every key is deleted first, since revisions start again from 1.
type Watcher struct {
	kv      jetstream.KeyValue
	stream  jetstream.Stream
	keys    string
	updates chan jetstream.KeyValueEntry
	cancel  context.CancelFunc
	done    chan struct{}

	inner   jetstream.KeyWatcher
	created time.Time         // the stream's creation time when the watch was opened
	live    map[string]uint64 // keys present, as delivered, and their revisions
	last    uint64            // the newest revision delivered
	lagging uint64            // the stream's last matching sequence, not delivered, at the last check
	resyncs atomic.Int64
}

// CheckInterval is how often a Watcher checks that its watch still follows the stream.
var CheckInterval = time.Second

// Watch follows the keys of kv matching keys (">" for all) until ctx is done or Stop. While NATS
// is not ready or the bucket is not found (deleted since it was opened: whoever starts next
// creates it), opening the first watch waits, until ctx ends; after that the Watcher retries by
// itself.
func Watch(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, keys string) (*Watcher, error) {
	w := &Watcher{kv: kv, keys: keys, updates: make(chan jetstream.KeyValueEntry, 256),
		done: make(chan struct{}), live: map[string]uint64{}}
	ctx, w.cancel = context.WithCancel(ctx)
	err := untilUp(ctx, "watch of bucket "+kv.Bucket(), func() (err error) {
		if w.stream, err = js.Stream(ctx, "KV_"+kv.Bucket()); err == nil {
			err = w.open(ctx)
		}
		if vanished(err) {
			return notYet{err}
		}
		return err
	})
	if err != nil {
		w.cancel()
		return nil, err
	}
	go w.run(ctx)
	return w, nil
}

// Updates delivers the entries; it is closed once the Watcher stops.
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

// Stop stops the Watcher and waits for its goroutine.
func (w *Watcher) Stop() error {
	w.cancel()
	<-w.done
	return nil
}

// Resyncs is how many times the Watcher re-opened its watch.
func (w *Watcher) Resyncs() int64 { return w.resyncs.Load() }

// open opens a watch that lives as long as ctx.
func (w *Watcher) open(ctx context.Context) error {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := w.stream.Info(ictx)
	if err != nil {
		return err
	}
	inner, err := w.kv.Watch(ctx, w.keys)
	if err != nil {
		return err
	}
	w.inner, w.created = inner, info.Created
	return nil
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer close(w.updates)
	defer func() {
		if w.inner != nil {
			_ = w.inner.Stop()
		}
	}()
	first := true
	var before map[string]uint64 // while re-syncing: the keys live before it
	check := time.NewTicker(CheckInterval)
	defer check.Stop()
	for {
		var in <-chan jetstream.KeyValueEntry
		if w.inner != nil {
			in = w.inner.Updates()
		}
		select {
		case <-ctx.Done():
			return
		case e, ok := <-in:
			if !ok {
				before = w.resync(ctx, false)
				continue
			}
			if e == nil { // the end of the current values
				for k := range before {
					if _, ok := w.live[k]; !ok && !w.send(ctx, deleted{w.kv.Bucket(), k}) {
						return
					}
				}
				before = nil
				if first && !w.send(ctx, nil) {
					return
				}
				first = false
				continue
			}
			if e.Operation() == jetstream.KeyValuePut {
				w.live[e.Key()] = e.Revision()
			} else {
				delete(w.live, e.Key())
			}
			w.last = max(w.last, e.Revision())
			if !w.send(ctx, e) {
				return
			}
		case <-check.C:
			switch stale, recreated := w.stale(ctx); {
			case recreated:
				for k := range w.live {
					if !w.send(ctx, deleted{w.kv.Bucket(), k}) {
						return
					}
				}
				w.live, w.last = map[string]uint64{}, 0
				before = w.resync(ctx, true)
			case stale:
				before = w.resync(ctx, false)
			}
		}
	}
}

// stale reports whether the watch missed a change for a whole interval, or the stream was
// recreated. A stream it cannot reach now is neither: the next check looks again.
func (w *Watcher) stale(ctx context.Context) (stale, recreated bool) {
	ctx, cancel := context.WithTimeout(ctx, CheckInterval)
	defer cancel()
	if w.inner == nil {
		return true, false
	}
	info, err := w.stream.Info(ctx)
	if err != nil {
		return false, false
	}
	if !info.Created.Equal(w.created) {
		return false, true
	}
	if info.State.LastSeq <= w.last {
		w.lagging = 0
		return false, false
	}
	// The stream holds later messages; is one of them a live change of our keys? (Expired or
	// other keys' messages are not.)
	m, err := w.stream.GetLastMsgForSubject(ctx, "$KV."+w.kv.Bucket()+"."+w.keys)
	if err != nil || m.Sequence <= w.last {
		w.lagging = 0
		return false, false
	}
	stale = w.lagging > w.last // what was missing at the last check is missing still
	w.lagging = m.Sequence
	return stale, false
}

// resync opens a new watch, retrying with backoff until it opens or ctx ends, and returns the keys
// live before it (for the deletes once the current values are in).
func (w *Watcher) resync(ctx context.Context, recreated bool) map[string]uint64 {
	if w.inner != nil {
		_ = w.inner.Stop()
		w.inner = nil
	}
	w.resyncs.Add(1)
	w.lagging = 0
	before := w.live
	if !recreated {
		w.live = map[string]uint64{}
	}
	for wait := 50 * time.Millisecond; ctx.Err() == nil; wait = min(2*wait, 5*time.Second) {
		if err := w.open(ctx); err == nil {
			return before
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return before
}

func (w *Watcher) send(ctx context.Context, e jetstream.KeyValueEntry) bool {
	select {
	case w.updates <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// deleted is the delete a re-sync delivers for a key that vanished while the watch was broken.
type deleted struct{ bucket, key string }

func (d deleted) Bucket() string                  { return d.bucket }
func (d deleted) Key() string                     { return d.key }
func (d deleted) Value() []byte                   { return nil }
func (d deleted) Revision() uint64                { return math.MaxUint64 }
func (d deleted) Created() time.Time              { return time.Time{} }
func (d deleted) Delta() uint64                   { return 0 }
func (d deleted) Operation() jetstream.KeyValueOp { return jetstream.KeyValueDelete }

// Follow delivers every entry of kv's keys matching keys (">" for all), the current values first,
// to fn from one goroutine counted in wg, until ctx is done; the watch heals (Watch). The returned
// channel is closed once the current values have been delivered (or the goroutine ended first).
func Follow(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, keys string, wg *sync.WaitGroup, fn func(jetstream.KeyValueEntry)) (<-chan struct{}, error) {
	w, err := Watch(ctx, js, kv, keys)
	if err != nil {
		return nil, errors.Join(errors.New("watch bucket "+kv.Bucket()), err)
	}
	ready := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { _ = w.Stop() }()
		markReady := sync.OnceFunc(func() { close(ready) })
		defer markReady()
		for e := range w.Updates() {
			if e == nil {
				markReady()
				continue
			}
			fn(e)
		}
	}()
	return ready, nil
}
