// Package prom exports the Go SDK's worker metrics to Prometheus: a training program that wants
// them connects with sdk.Connect(ctx, url, prom.WithMetrics(reg)). It is a package of its own so
// that a worker that does not want them links no Prometheus client.
package prom

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/sdk"
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

// WithMetrics registers the workers' metrics in reg (for example prometheus.DefaultRegisterer, served
// by the training process's own /metrics), labelled by fanin_job and rank (a worker's first rank):
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
// Several clients may register in the same registry: they share the collectors. A metric of the
// same name and another kind in reg fails the client's Connect (or sdk.New).
func WithMetrics(reg prometheus.Registerer) sdk.Option {
	return func(c *sdk.Client) error {
		if reg == nil {
			return errors.New("prom.WithMetrics: nil registerer")
		}
		m, err := newMeter(reg)
		if err != nil {
			return err
		}
		return sdk.WithMeter(m)(c)
	}
}

// meter holds the collectors a Client's workers update.
type meter struct {
	steps, errors, bytes, fetched *prometheus.CounterVec
	stepDur, publishDur           *prometheus.HistogramVec
}

func newMeter(reg prometheus.Registerer) (*meter, error) {
	l := []string{metrics.JobLabel, "rank"}
	buckets := prometheus.ExponentialBuckets(0.00025, 2, 18) // 0.25 ms to about 33 s
	m := &meter{
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
			return nil, err
		}
	}
	for _, hv := range []**prometheus.HistogramVec{&m.stepDur, &m.publishDur} {
		if err := register(reg, hv); err != nil {
			return nil, err
		}
	}
	return m, nil
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
	if err != nil {
		return fmt.Errorf("register worker metrics: %w", err)
	}
	return nil
}

// Worker resolves one worker's series once.
func (m *meter) Worker(job string, rank int) sdk.WorkerMeter {
	r := strconv.Itoa(rank)
	return &workerMeter{m: m, job: job, rank: r,
		steps: m.steps.WithLabelValues(job, r), bytes: m.bytes.WithLabelValues(job, r),
		fetched: m.fetched.WithLabelValues(job, r),
		stepDur: m.stepDur.WithLabelValues(job, r), publishDur: m.publishDur.WithLabelValues(job, r)}
}

type workerMeter struct {
	m                     *meter
	job, rank             string
	steps, bytes, fetched prometheus.Counter
	stepDur, publishDur   prometheus.Observer
}

func (w *workerMeter) Published(d time.Duration, bytes int) {
	w.publishDur.Observe(d.Seconds())
	w.bytes.Add(float64(bytes))
}

func (w *workerMeter) Stepped(d time.Duration) {
	w.stepDur.Observe(d.Seconds())
	w.steps.Inc()
}

func (w *workerMeter) Fetched() { w.fetched.Inc() }

func (w *workerMeter) Failed(reason string) {
	w.m.errors.WithLabelValues(w.job, w.rank, reason).Inc()
}
