package runtime

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetConsumerFaults makes every shard consumer started from now on check itself every check while
// idle, and drop the deliveries lose picks (nil: none) as if lost on their way. undo restores the
// defaults; call it once the runtimes have stopped.
func SetConsumerFaults(check time.Duration, lose func(jetstream.Msg) bool) (undo func()) {
	prev := consumerCheck.Swap(int64(check))
	if lose != nil {
		loseDelivery.Store(&lose)
	}
	return func() {
		consumerCheck.Store(prev)
		loseDelivery.Store(nil)
	}
}

// MuteConsumeErrors makes every shard consumer ignore what the client library reports of its
// consumption (missed heartbeats, a deleted consumer) until undo.
func MuteConsumeErrors() (undo func()) {
	muteConsumeErrors.Store(true)
	return func() { muteConsumeErrors.Store(false) }
}

// SetLoadInterval sets the interval of the periodic load reports of runtimes started from now on;
// undo restores the default.
func SetLoadInterval(d time.Duration) (undo func()) {
	prev := loadEvery.Swap(int64(d))
	return func() { loadEvery.Store(prev) }
}

// SetMinOverheadWork sets the least work between two readings of the process's CPU that gives an
// Overhead, for runtimes started from now on; undo restores the default.
func SetMinOverheadWork(d time.Duration) (undo func()) {
	prev := minOverheadWork.Swap(int64(d))
	return func() { minOverheadWork.Store(prev) }
}

// FailHandovers fails every write of shard key's handover record for which fail returns an error,
// as if the write's requests had timed out; undo restores the default.
func FailHandovers(key string, fail func() error) (undo func()) {
	failHandover.Store(key, fail)
	return func() { failHandover.Delete(key) }
}
