package store

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
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
