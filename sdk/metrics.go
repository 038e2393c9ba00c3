package sdk

import (
	"context"
	"errors"
	"time"

	"github.com/fanin-ml/fanin/wire"
)

// Meter receives the measurements of a Client's workers (WithMeter). The SDK links no metrics
// library: package sdk/prom is a Meter that exports them as Prometheus metrics
// (prom.WithMetrics), and a program may write its own. A Meter and its WorkerMeters must be safe
// for concurrent use: a client's workers run on whichever goroutines call them.
type Meter interface {
	// Worker returns the recorder of one worker, when it joins job as rank (its first rank, if
	// it holds several).
	Worker(job string, rank int) WorkerMeter
}

// WorkerMeter records one worker's measurements.
type WorkerMeter interface {
	// Published: a step's gradient, bytes of it, was stored by JetStream, d after its publish began.
	Published(d time.Duration, bytes int)
	// Stepped: a Step completed, d from publishing the gradient to holding every shard's new
	// parameters (what aggregation adds to the training step).
	Stepped(d time.Duration)
	// Fetched: a shard's parameters were not pushed in time and were fetched from the stream.
	Fetched()
	// Failed: a Step call failed, for reason: a rejection reason (wire.Reason, docs/PROTOCOL.md),
	// "timeout" (its context ended) or "other".
	Failed(reason string)
}

// WithMeter records the workers' measurements in m (nil: none, the default).
func WithMeter(m Meter) Option {
	return func(c *Client) error { c.meter = m; return nil }
}

// workerMeters is one worker's recorder; the zero value does nothing.
type workerMeters struct{ m WorkerMeter }

func meterOf(m Meter, job string, rank int) workerMeters {
	if m == nil {
		return workerMeters{}
	}
	return workerMeters{m.Worker(job, rank)}
}

func (w workerMeters) published(start time.Time, bytes int) {
	if w.m != nil {
		w.m.Published(time.Since(start), bytes)
	}
}

func (w workerMeters) stepped(start time.Time) {
	if w.m != nil {
		w.m.Stepped(time.Since(start))
	}
}

func (w workerMeters) fetched() {
	if w.m != nil {
		w.m.Fetched()
	}
}

func (w workerMeters) failed(err error) {
	if w.m == nil {
		return
	}
	reason := "other"
	var rej *wire.Reject
	switch {
	case errors.As(err, &rej):
		reason = string(rej.Reason)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		reason = "timeout"
	}
	w.m.Failed(reason)
}
