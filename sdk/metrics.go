package sdk

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/wire"
)

// Worker metrics, in the registry given to WithMetrics.
const (
	WorkerSteps          = "fanin_worker_steps_total"
	WorkerStepErrors     = "fanin_worker_step_errors_total"
	WorkerStepSeconds    = "fanin_worker_step_duration_seconds"
	WorkerPublishSeconds = "fanin_worker_publish_duration_seconds"
	WorkerGradientBytes  = "fanin_worker_gradient_bytes_total"
	WorkerParamsFetched  = "fanin_worker_params_fetched_total"
)

// MetricNames lists the worker metrics and their types, as metrics.Names does fanin's own.
func MetricNames() map[string]string {
	return map[string]string{
		WorkerSteps: "counter", WorkerStepErrors: "counter", WorkerGradientBytes: "counter", WorkerParamsFetched: "counter",
		WorkerStepSeconds: "histogram", WorkerPublishSeconds: "histogram",
	}
}

// workerMetrics are the collectors a Client's workers update; nil when metrics are off.
type workerMetrics struct {
	steps, errors, bytes, fetched *prometheus.CounterVec
	stepDur, publishDur           *prometheus.HistogramVec
}

// WithMetrics registers the workers' metrics in reg (for example prometheus.DefaultRegisterer, served
// by the training process's own /metrics), labelled by fanin_job and rank:
//
//   - fanin_worker_steps_total: steps completed;
//   - fanin_worker_step_errors_total{reason}: failed Step calls, by rejection reason (docs/PROTOCOL.md),
//     "timeout" or "other";
//   - fanin_worker_step_duration_seconds: a Step, from publishing the gradient to holding every
//     shard's new parameters (what aggregation adds to the training step);
//   - fanin_worker_publish_duration_seconds: publishing a step's gradient until JetStream stored it;
//   - fanin_worker_gradient_bytes_total: gradient bytes published;
//   - fanin_worker_params_fetched_total: shards whose parameters were not pushed in time and were
//     fetched from the stream instead.
//
// Several clients may register in the same registry: they share the collectors.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(c *Client) error {
		l := []string{metrics.JobLabel, "rank"}
		buckets := prometheus.ExponentialBuckets(0.00025, 2, 18) // 0.25 ms to about 33 s
		m := &workerMetrics{
			steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: WorkerSteps,
				Help: "Steps the worker completed."}, l),
			errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: WorkerStepErrors,
				Help: "Step calls that failed, by reason: a rejection reason, timeout or other."}, append(l, "reason")),
			bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: WorkerGradientBytes,
				Help: "Gradient bytes the worker published."}, l),
			fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: WorkerParamsFetched,
				Help: "Shards whose parameters were fetched from the stream because they were not pushed in time."}, l),
			stepDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: WorkerStepSeconds,
				Help: "Step latency: from publishing the gradient to holding every shard's new parameters.", Buckets: buckets}, l),
			publishDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: WorkerPublishSeconds,
				Help: "Publishing a step's gradient until JetStream stored every shard of it.", Buckets: buckets}, l),
		}
		for _, cv := range []**prometheus.CounterVec{&m.steps, &m.errors, &m.bytes, &m.fetched} {
			if err := register(reg, cv); err != nil {
				return err
			}
		}
		for _, hv := range []**prometheus.HistogramVec{&m.stepDur, &m.publishDur} {
			if err := register(reg, hv); err != nil {
				return err
			}
		}
		c.met = m
		return nil
	}
}

// register registers *col in reg or, when another client registered the same metric first,
// points *col at that one.
func register[C prometheus.Collector](reg prometheus.Registerer, col *C) error {
	err := reg.Register(*col)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		existing, ok := are.ExistingCollector.(C)
		if !ok {
			return fmt.Errorf("register worker metrics: %w", err)
		}
		*col = existing
		return nil
	}
	return err
}

// workerMeters are one worker's handles, resolved once; the zero value does nothing.
type workerMeters struct {
	m                    *workerMetrics
	job, rank            string
	steps, bytes, fetchd prometheus.Counter
	stepDur, publishDur  prometheus.Observer
}

func (m *workerMetrics) worker(job string, rank int) workerMeters {
	if m == nil {
		return workerMeters{}
	}
	r := strconv.Itoa(rank)
	return workerMeters{m: m, job: job, rank: r,
		steps: m.steps.WithLabelValues(job, r), bytes: m.bytes.WithLabelValues(job, r),
		fetchd:  m.fetched.WithLabelValues(job, r),
		stepDur: m.stepDur.WithLabelValues(job, r), publishDur: m.publishDur.WithLabelValues(job, r)}
}

func (w workerMeters) published(start time.Time, bytes int) {
	if w.m != nil {
		w.publishDur.Observe(time.Since(start).Seconds())
		w.bytes.Add(float64(bytes))
	}
}

func (w workerMeters) stepped(start time.Time) {
	if w.m != nil {
		w.stepDur.Observe(time.Since(start).Seconds())
		w.steps.Inc()
	}
}

func (w workerMeters) fetched() {
	if w.m != nil {
		w.fetchd.Inc()
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
	w.m.errors.WithLabelValues(w.job, w.rank, reason).Inc()
}
