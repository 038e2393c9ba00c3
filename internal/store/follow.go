package store

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Follow delivers every entry of w, the current values first, to fn from one goroutine counted in
// wg, until ctx is done or the watch closes; then it stops w. The returned channel is closed once
// the current values have been delivered (or the goroutine ended before that).
func Follow(ctx context.Context, w jetstream.KeyWatcher, wg *sync.WaitGroup, fn func(jetstream.KeyValueEntry)) <-chan struct{} {
	ready := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { _ = w.Stop() }()
		markReady := sync.OnceFunc(func() { close(ready) })
		defer markReady()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the end of the current values
					markReady()
					continue
				}
				fn(e)
			}
		}
	}()
	return ready
}
