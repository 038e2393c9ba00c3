package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// FenceKey is the key, in every bucket the autoscaler leader writes (placement, assignments), of
// the leadership term allowed to write it. Job ids start with a letter or digit, so it is never a
// job's key; followers skip it (IsFence).
const FenceKey = "_fence"

// IsFence tells a bucket's fence key from its data.
func IsFence(key string) bool { return key == FenceKey }

// HdrTerm names the leadership term (JSON, a Term) of a message the leader sends: every fenced
// write, and the runtime stop request.
const HdrTerm = "Fanin-Term"

// Term orders the autoscaler's leaderships: a later one is After an earlier one. Rev is the
// revision at which the leader lock was taken, Epoch the creation time of the lock bucket's stream
// (Unix nanoseconds), so that terms keep their order when the bucket is recreated and its
// revisions start again from 1.
type Term struct {
	Epoch  int64  `json:"epoch"`
	Rev    uint64 `json:"rev"`
	Leader string `json:"leader"`
}

// After reports whether t is a later term than o.
func (t Term) After(o Term) bool {
	if t.Epoch != o.Epoch {
		return t.Epoch > o.Epoch
	}
	return t.Rev > o.Rev
}

// IsZero reports whether t is no term.
func (t Term) IsZero() bool { return t.Rev == 0 }

// ErrFenced is the error of a leader whose term is over: a later term holds the fence, and the
// server refuses its writes.
var ErrFenced = errors.New("a later autoscaler leadership term holds the fence")

// A Fence makes one leadership term the only writer of a stream: Claim stores the term under the
// stream's fence subject, if no later term is stored there, and every write through the Fence
// carries the claim's sequence as a condition (Nats-Expected-Last-Subject-Sequence on the fence
// subject), so that the server refuses it once a later term has claimed the fence. A deposed
// leader's write thus fails at the server, however late it arrives.
type Fence struct {
	js      jetstream.JetStream
	stream  string // the fenced stream
	subject string // its fence subject
	prefix  string // for a bucket: "$KV.<bucket>.", the subject of a key is prefix+key
	term    Term

	mu  sync.Mutex // guards seq
	seq uint64     // the sequence of this term's claim; 0 while not claimed
}

// NewKVFence is the fence of bucket for term: its key FenceKey.
func NewKVFence(js jetstream.JetStream, bucket string, term Term) *Fence {
	prefix := "$KV." + bucket + "."
	return &Fence{js: js, stream: "KV_" + bucket, subject: prefix + FenceKey, prefix: prefix, term: term}
}

// NewStreamFence is the fence of stream for term under subject, one of the stream's subjects
// that nothing else publishes to.
func NewStreamFence(js jetstream.JetStream, stream, subject string, term Term) *Fence {
	return &Fence{js: js, stream: stream, subject: subject, term: term}
}

// Term is the fence's term.
func (f *Fence) Term() Term { return f.term }

// Claimed is the sequence of the term's claim, 0 while not claimed.
func (f *Fence) Claimed() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// Claim stores the fence's term under the fence subject unless it is claimed already, and returns
// the claim's sequence. It fails with ErrFenced when a later term is stored there, and is refused
// by the server (an error to retry) when another claim came in between.
func (f *Fence) Claim(ctx context.Context) (uint64, error) {
	if seq := f.Claimed(); seq != 0 {
		return seq, nil
	}
	st, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		return 0, fmt.Errorf("claim the fence of %s: %w", f.stream, err)
	}
	var last uint64
	m, err := st.GetLastMsgForSubject(ctx, f.subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return 0, fmt.Errorf("claim the fence of %s: %w", f.stream, err)
	default:
		var cur Term
		if err := json.Unmarshal(m.Data, &cur); err == nil && cur.After(f.term) {
			return 0, fmt.Errorf("%w of %s: term %d of %s, ours %d", ErrFenced, f.stream, cur.Rev, cur.Leader, f.term.Rev)
		}
		last = m.Sequence
	}
	data, _ := json.Marshal(f.term)
	ack, err := f.js.Publish(ctx, f.subject, data, jetstream.WithExpectLastSequenceForSubject(last, f.subject))
	if err != nil {
		return 0, fmt.Errorf("claim the fence of %s: %w", f.stream, err)
	}
	f.mu.Lock()
	f.seq = ack.Sequence
	f.mu.Unlock()
	return ack.Sequence, nil
}

// Put writes key of the fenced bucket, unless a later term has claimed the fence.
func (f *Fence) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return f.write(ctx, &nats.Msg{Subject: f.prefix + key, Data: value, Header: nats.Header{}})
}

// Delete deletes key of the fenced bucket (a delete marker), unless a later term has claimed the
// fence.
func (f *Fence) Delete(ctx context.Context, key string) error {
	_, err := f.write(ctx, &nats.Msg{Subject: f.prefix + key, Header: nats.Header{"KV-Operation": {"DEL"}}})
	return err
}

// Purge deletes key of the fenced bucket with its history, unless a later term has claimed the
// fence.
func (f *Fence) Purge(ctx context.Context, key string) error {
	_, err := f.write(ctx, &nats.Msg{Subject: f.prefix + key, Header: nats.Header{"KV-Operation": {"PURGE"}, "Nats-Rollup": {"sub"}}})
	return err
}

// Publish publishes data to subject of the fenced stream, unless a later term has claimed the
// fence.
func (f *Fence) Publish(ctx context.Context, subject string, data []byte) (uint64, error) {
	return f.write(ctx, &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}})
}

// write publishes m on the condition that the fence is still this term's claim. A refused write
// unclaims the fence: the next Claim finds the later term (ErrFenced), or claims it again if the
// fence was lost with its stream.
func (f *Fence) write(ctx context.Context, m *nats.Msg) (uint64, error) {
	seq := f.Claimed()
	if seq == 0 {
		return 0, fmt.Errorf("%s: the fence is not claimed", f.stream)
	}
	t, _ := json.Marshal(f.term)
	m.Header.Set(HdrTerm, string(t)) // every write carries its term
	ack, err := f.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequenceForSubject(seq, f.subject))
	if refused(err) {
		f.mu.Lock()
		if f.seq == seq {
			f.seq = 0
		}
		f.mu.Unlock()
		return 0, fmt.Errorf("%w of %s (term %d): %w", ErrFenced, f.stream, f.term.Rev, err)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// BucketTerm is the term that holds the fence of bucket, zero if none does.
func BucketTerm(ctx context.Context, js jetstream.JetStream, bucket string) (Term, error) {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return Term{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+bucket+"."+FenceKey)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Term{}, nil
	}
	if err != nil {
		return Term{}, err
	}
	var t Term
	if err := json.Unmarshal(m.Data, &t); err != nil {
		return Term{}, fmt.Errorf("the fence of %s: %w", bucket, err)
	}
	return t, nil
}

// Refused tells the server's refusal of a conditional write: a fenced one, or a compare-and-set
// on a key's revision.
func Refused(err error) bool { return refused(err) }

// refused tells the server's refusal of a conditional write ("wrong last sequence"; replicated
// streams answer with a code of their own).
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
