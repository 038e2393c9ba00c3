package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// A job whose shard checkpoint does not fit the server's max_payload is refused with the numbers.
func TestCheckFits(t *testing.T) {
	t.Parallel()
	spec := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{1 << 20}}}, Ranks: 2,
		Function: job.Function{Name: "adam"}, ShardSize: 1 << 20}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	err := CheckFits(&rec, 1<<20) // NATS's default max_payload
	if !errors.Is(err, job.ErrInvalidSpec) || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("got %v, want an invalid spec error naming max_payload", err)
	}
	if err := CheckFits(&rec, 32<<20); err != nil {
		t.Fatalf("3 MiB checkpoint under a 32 MiB limit: %v", err)
	}
	spec.Function.Name = "sgd" // stateless: one vector of 1 MiB plus headers still exceeds 1 MiB
	rec = job.NewRecord(spec, time.Now())
	if err := CheckFits(&rec, 1<<20); err == nil {
		t.Fatal("a 1 MiB shard plus headers was accepted under a 1 MiB max_payload")
	}
}

// TestStartErrorsWaitedFor: the JetStream errors a component meets at start on a cluster still
// forming (a store its servers failed to create, a leader that does not know every server yet) are
// waited for (untilUp retries a notYet); the rest are not.
func TestStartErrorsWaitedFor(t *testing.T) {
	for _, c := range []struct {
		err  error
		wait bool
	}{
		{&jetstream.APIError{ErrorCode: errClusterNoPeers, Description: "no suitable peers for placement"}, true},
		{&jetstream.APIError{ErrorCode: errStreamCreate, Description: "error creating store for stream"}, true},
		{jetstream.ErrInvalidJetStreamResponse, true},
		{&jetstream.APIError{ErrorCode: errInsufficientResources, Description: "insufficient resources"}, false},
		{&jetstream.APIError{ErrorCode: errStreamCreate, Description: "stream name is required"}, false},
	} {
		if got := waitAtStart(c.err); got != c.wait {
			t.Errorf("%v: waited for %v, want %v", c.err, got, c.wait)
		}
	}
}

// A component at start waits while JetStream is not yet enabled for its account (a server of a
// cluster that just formed), and reports it once that lasts.
func TestJetStreamOffWaitedFor(t *testing.T) {
	off := func() error {
		return fmt.Errorf("open bucket %s: %w", wire.JobsBucket, &jetstream.APIError{Code: 503, ErrorCode: 10039, Description: "JetStream not enabled for account"})
	}
	for _, c := range []struct {
		err error
		off bool
	}{
		{off(), true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10076, Description: "jetstream not enabled"}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: errClusterNotAvailable}, false},
		{errors.New("JetStream not enabled for account"), false}, // not JetStream's answer
	} {
		if got := jetStreamOff(c.err); got != c.off {
			t.Errorf("jetStreamOff(%v) = %v, want %v", c.err, got, c.off)
		}
	}

	calls := 0
	err := untilUp(context.Background(), "bucket", func() error {
		if calls++; calls < 3 {
			return off()
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("untilUp: %v after %d calls, want nil after 3 (two answers of JetStream off, then up)", err, calls)
	}

	calls = 0 // it never comes up: with no time to wait, reported at once
	err = untilUpFor(context.Background(), "bucket", 0, func() error { calls++; return off() })
	if calls != 1 || !jetStreamOff(err) || !strings.Contains(err.Error(), "enable it there") {
		t.Errorf("untilUp with JetStream off for good: %v after %d calls, want it reported after 1", err, calls)
	}
}
