// Package metrics is fanin's Prometheus instrumentation: one registry per process with the metrics
// of every component it runs (runtimes, autoscaler, NATS connections), and the /metrics handler.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metric names. Every one is listed in Names; deploy/grafana's test checks the dashboards against it.
const (
	RuntimeInvocations       = "fanin_runtime_invocations_total"
	RuntimeInvocationSeconds = "fanin_runtime_invocation_duration_seconds"
	RuntimeFunctionSeconds   = "fanin_runtime_function_duration_seconds"
	RuntimeQueueWaitSeconds  = "fanin_runtime_queue_wait_seconds"
	RuntimeGradientBytes     = "fanin_runtime_gradient_bytes_total"
	RuntimeRejects           = "fanin_runtime_rejects_total"
	RuntimeRepliesDropped    = "fanin_runtime_replies_dropped_total"
	RuntimeMigrations        = "fanin_runtime_migrations_total"
	RuntimeMigrationPause    = "fanin_runtime_migration_pause_seconds"
	RuntimeShards            = "fanin_runtime_shards"
	RuntimePending           = "fanin_runtime_pending_messages"
	RuntimeStep              = "fanin_runtime_step"
	RuntimeCores             = "fanin_runtime_cores"

	AutoscalerPoolSize    = "fanin_autoscaler_pool_size"
	AutoscalerPoolCores   = "fanin_autoscaler_pool_cores"
	AutoscalerDesiredSize = "fanin_autoscaler_desired_pool_size"
	AutoscalerDemandCores = "fanin_autoscaler_demand_cores"
	AutoscalerDecisions   = "fanin_autoscaler_decisions_total"
	AutoscalerMoves       = "fanin_autoscaler_moves_total"
	AutoscalerDrains      = "fanin_autoscaler_drains_total"
	AutoscalerLeader      = "fanin_autoscaler_leader"
	AutoscalerShards      = "fanin_autoscaler_shards"
	AutoscalerErrors      = "fanin_autoscaler_step_errors_total"

	NATSConnected  = "fanin_nats_connected"
	NATSReconnects = "fanin_nats_reconnects_total"

	HTTPRequests       = "fanin_http_requests_total"
	HTTPRequestSeconds = "fanin_http_request_duration_seconds"
)

// JobLabel is the label of a training job's id. Not "job": Prometheus gives that label to the scrape
// job of every series it stores, and would rename fanin's to exported_job.
const JobLabel = "fanin_job"

// Names lists every fanin metric name with its type ("counter", "gauge", "histogram").
func Names() map[string]string {
	return map[string]string{
		RuntimeInvocations: "counter", RuntimeInvocationSeconds: "histogram", RuntimeFunctionSeconds: "histogram",
		RuntimeQueueWaitSeconds: "histogram", RuntimeGradientBytes: "counter", RuntimeRejects: "counter", RuntimeRepliesDropped: "counter",
		RuntimeMigrations: "counter", RuntimeMigrationPause: "histogram", RuntimeShards: "gauge",
		RuntimePending: "gauge", RuntimeStep: "gauge", RuntimeCores: "gauge",
		AutoscalerPoolSize: "gauge", AutoscalerPoolCores: "gauge", AutoscalerDesiredSize: "gauge",
		AutoscalerDemandCores: "gauge", AutoscalerDecisions: "counter", AutoscalerMoves: "counter",
		AutoscalerDrains: "counter", AutoscalerLeader: "gauge", AutoscalerShards: "gauge", AutoscalerErrors: "counter",
		NATSConnected: "gauge", NATSReconnects: "counter",
		HTTPRequests: "counter", HTTPRequestSeconds: "histogram",
	}
}

// latencyBuckets span 0.25 ms to about 33 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.00025, 2, 18)

// Metrics is a registry with fanin's metrics. Its methods and those of the handles it gives are
// safe for concurrent use and do nothing on a nil receiver, so that instrumented code needs no
// checks when metrics are off.
type Metrics struct {
	reg *prometheus.Registry

	invocations   *prometheus.CounterVec   // runtime, fanin_job
	invocationDur *prometheus.HistogramVec // runtime, fanin_job
	functionDur   *prometheus.HistogramVec // runtime, fanin_job
	queueWait     *prometheus.HistogramVec // runtime, fanin_job
	gradBytes     *prometheus.CounterVec   // runtime, fanin_job
	rejects       *prometheus.CounterVec   // runtime, fanin_job, reason
	repliesDrop   *prometheus.CounterVec   // runtime, fanin_job
	migrations    *prometheus.CounterVec   // runtime
	pauses        *prometheus.HistogramVec // runtime
	shards        *shardCollector

	asOnce                                                 sync.Once // registers the autoscaler's metrics on first use
	poolSize, poolCores, desired, demand, leader, asShards prometheus.Gauge
	decisions                                              *prometheus.CounterVec // mode
	moves, drains, asErrors                                prometheus.Counter

	conns *connCollector

	httpRequests *prometheus.CounterVec   // route, code
	httpDuration *prometheus.HistogramVec // route
}

// New makes a registry with fanin's metrics and the Go runtime's and the process's.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	rl := []string{"runtime", JobLabel}
	m.invocations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: RuntimeInvocations,
		Help: "Shard invocations applied: one per shard and step."}, rl)
	m.invocationDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RuntimeInvocationSeconds,
		Help: "Shard invocation latency: from the step's first gradient stored in JetStream to the new parameters published.", Buckets: latencyBuckets}, rl)
	m.functionDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RuntimeFunctionSeconds,
		Help: "Time in the aggregation function, per shard invocation.", Buckets: latencyBuckets}, rl)
	m.queueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RuntimeQueueWaitSeconds,
		Help: "Queue wait per shard invocation: the gradient that completed the step, from stored in JetStream to folded (delivery, the shard's backlog, the wait for a core).", Buckets: latencyBuckets}, rl)
	m.gradBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: RuntimeGradientBytes,
		Help: "Gradient bytes aggregated (accepted and folded)."}, rl)
	m.rejects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: RuntimeRejects,
		Help: "Gradient messages rejected, by reason (docs/PROTOCOL.md section 5)."}, []string{"runtime", JobLabel, "reason"})
	m.repliesDrop = prometheus.NewCounterVec(prometheus.CounterOpts{Name: RuntimeRepliesDropped,
		Help: "Rejection reports not sent because the message's Fanin-Reply-To was outside its job's reply namespace."}, rl)
	m.migrations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: RuntimeMigrations,
		Help: "Shards taken over from another runtime after it released them."}, []string{"runtime"})
	m.pauses = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RuntimeMigrationPause,
		Help: "Migration pause per shard: from the previous owner's release to this runtime serving.", Buckets: latencyBuckets}, []string{"runtime"})
	m.shards = &shardCollector{
		shards:  prometheus.NewDesc(RuntimeShards, "Shards served by the runtime, per job.", rl, nil),
		pending: prometheus.NewDesc(RuntimePending, "Gradient messages waiting in the runtime's consumers, per job.", rl, nil),
		step:    prometheus.NewDesc(RuntimeStep, "Last step applied to all the job's shards on the runtime.", rl, nil),
		cores:   prometheus.NewDesc(RuntimeCores, "Concurrent shard invocations the runtime allows.", []string{"runtime"}, nil),
		sources: map[*RuntimeMetrics]source{},
	}

	m.poolSize = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerPoolSize, Help: "Live runtimes in the pool, as the autoscaler leader observed them."})
	m.poolCores = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerPoolCores, Help: "Cores of the live runtimes."})
	m.desired = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerDesiredSize, Help: "Runtimes the autoscaler wants in the pool."})
	m.demand = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerDemandCores, Help: "Cores the load needs at its peak: the basis of the desired size."})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerLeader, Help: "1 while this autoscaler holds the leader lock."})
	m.asShards = prometheus.NewGauge(prometheus.GaugeOpts{Name: AutoscalerShards, Help: "Shards of all jobs, placed or not."})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: AutoscalerDecisions, Help: "Decisions taken by the leader, by mode (stable or panic)."}, []string{"mode"})
	m.moves = prometheus.NewCounter(prometheus.CounterOpts{Name: AutoscalerMoves, Help: "Shard moves decided (placements of new shards and migrations)."})
	m.drains = prometheus.NewCounter(prometheus.CounterOpts{Name: AutoscalerDrains, Help: "Runtimes the autoscaler decided to drain."})
	m.asErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: AutoscalerErrors, Help: "Decisions the leader could not carry out fully."})

	m.conns = &connCollector{
		connected:  prometheus.NewDesc(NATSConnected, "1 while the NATS connection is connected.", []string{"connection"}, nil),
		reconnects: prometheus.NewDesc(NATSReconnects, "Reconnections of the NATS connection.", []string{"connection"}, nil),
		conns:      map[*connEntry]struct{}{},
	}

	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: HTTPRequests,
		Help: "HTTP requests served, by route (the ServeMux pattern) and status code."}, []string{"route", "code"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: HTTPRequestSeconds,
		Help: "HTTP request latency, by route.", Buckets: latencyBuckets}, []string{"route"})

	m.reg.MustRegister(m.httpRequests, m.httpDuration)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.invocations, m.invocationDur, m.functionDur, m.queueWait, m.gradBytes, m.rejects, m.repliesDrop, m.migrations, m.pauses, m.shards,
		m.conns,
	)
	return m
}

var (
	defaultOnce sync.Once
	defaultM    *Metrics
)

// Default is the process's registry: what Handler serves, and what components use unless given
// another.
func Default() *Metrics {
	defaultOnce.Do(func() { defaultM = New() })
	return defaultM
}

// Handler serves the process's metrics (Default) in the Prometheus text format: mount it at /metrics.
func Handler() http.Handler { return Default().Handler() }

// Handler serves m's metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Registry is the underlying registry, to register more collectors or to gather in tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// RuntimeMetrics are the metrics of one runtime.
type RuntimeMetrics struct {
	m  *Metrics
	id string

	migrations prometheus.Counter
	pauses     prometheus.Observer
}

// Runtime returns the handle of runtime id.
func (m *Metrics) Runtime(id string) *RuntimeMetrics {
	if m == nil {
		return nil
	}
	return &RuntimeMetrics{m: m, id: id,
		migrations: m.migrations.WithLabelValues(id), pauses: m.pauses.WithLabelValues(id)}
}

// JobMetrics are the handles of one job on one runtime, resolved once so that updates on the hot
// path are atomic adds without allocation.
type JobMetrics struct {
	invocations   prometheus.Counter
	invocationDur prometheus.Observer
	functionDur   prometheus.Observer
	queueWait     prometheus.Observer
	bytes         prometheus.Counter
}

// Job returns the handles of job on the runtime.
func (r *RuntimeMetrics) Job(job string) *JobMetrics {
	if r == nil {
		return nil
	}
	m := r.m
	return &JobMetrics{
		invocations:   m.invocations.WithLabelValues(r.id, job),
		invocationDur: m.invocationDur.WithLabelValues(r.id, job),
		functionDur:   m.functionDur.WithLabelValues(r.id, job),
		queueWait:     m.queueWait.WithLabelValues(r.id, job),
		bytes:         m.gradBytes.WithLabelValues(r.id, job),
	}
}

// ForgetJob removes the runtime's series of a job it no longer serves.
func (r *RuntimeMetrics) ForgetJob(job string) {
	if r == nil {
		return
	}
	m := r.m
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.invocations, m.invocationDur, m.functionDur, m.queueWait, m.gradBytes} {
		v.DeleteLabelValues(r.id, job)
	}
	m.rejects.DeletePartialMatch(prometheus.Labels{"runtime": r.id, JobLabel: job})
	m.repliesDrop.DeletePartialMatch(prometheus.Labels{"runtime": r.id, JobLabel: job})
}

// Gradient counts the bytes of one gradient folded into a shard's sum.
func (j *JobMetrics) Gradient(bytes int) {
	if j != nil {
		j.bytes.Add(float64(bytes))
	}
}

// Invocation records one applied shard invocation.
func (j *JobMetrics) Invocation(total, function, queueWait time.Duration) {
	if j == nil {
		return
	}
	j.invocations.Inc()
	j.invocationDur.Observe(total.Seconds())
	j.functionDur.Observe(function.Seconds())
	j.queueWait.Observe(queueWait.Seconds())
}

// Reject counts a rejected gradient.
func (r *RuntimeMetrics) Reject(job, reason string) {
	if r != nil {
		r.m.rejects.WithLabelValues(r.id, job, reason).Inc()
	}
}

// ReplyDropped counts a rejection report not sent: its reply subject was outside the job's.
func (r *RuntimeMetrics) ReplyDropped(job string) {
	if r != nil {
		r.m.repliesDrop.WithLabelValues(r.id, job).Inc()
	}
}

// Migration records a shard taken over after the given pause.
func (r *RuntimeMetrics) Migration(pause time.Duration) {
	if r != nil {
		r.migrations.Inc()
		r.pauses.Observe(pause.Seconds())
	}
}

// ShardGauge is what a runtime reports of one shard when metrics are scraped.
type ShardGauge struct {
	Job     string
	Pending uint64 // gradient messages waiting in the shard's consumer
	Step    int64  // last applied step
}

// Observe registers the function that reports the runtime's shards, and its cores, at each scrape,
// until Close. A runtime id observed twice in one process (tests) is reported once.
func (r *RuntimeMetrics) Observe(cores int, shards func(yield func(ShardGauge))) {
	if r == nil {
		return
	}
	c := r.m.shards
	c.mu.Lock()
	c.sources[r] = source{cores: cores, shards: shards}
	c.mu.Unlock()
}

// Close stops reporting the runtime's shards.
func (r *RuntimeMetrics) Close() {
	if r == nil {
		return
	}
	c := r.m.shards
	c.mu.Lock()
	delete(c.sources, r)
	c.mu.Unlock()
}

// AutoscalerMetrics are the autoscaler's.
type AutoscalerMetrics struct{ m *Metrics }

// Autoscaler returns the autoscaler's handle. Its metrics are registered by the first call, so that
// only processes that run an autoscaler export them.
func (m *Metrics) Autoscaler() *AutoscalerMetrics {
	if m == nil {
		return nil
	}
	m.asOnce.Do(func() {
		m.reg.MustRegister(m.poolSize, m.poolCores, m.desired, m.demand, m.leader, m.asShards, m.decisions, m.moves, m.drains, m.asErrors)
	})
	return &AutoscalerMetrics{m: m}
}

// Decision records one decision of the leader: the pool it observed and what it decided.
func (a *AutoscalerMetrics) Decision(pool, poolCores, shards, desired int, demand float64, mode string, moves, drains int) {
	if a == nil {
		return
	}
	m := a.m
	m.poolSize.Set(float64(pool))
	m.poolCores.Set(float64(poolCores))
	m.asShards.Set(float64(shards))
	m.desired.Set(float64(desired))
	m.demand.Set(demand)
	m.decisions.WithLabelValues(mode).Inc()
	m.moves.Add(float64(moves))
	m.drains.Add(float64(drains))
}

// WatchConn reports the state of the autoscaler's NATS connection (see Metrics.WatchConn).
func (a *AutoscalerMetrics) WatchConn(name string, nc *nats.Conn) (stop func()) {
	if a == nil {
		return func() {}
	}
	return a.m.WatchConn(name, nc)
}

// Error counts a decision that could not be carried out fully.
func (a *AutoscalerMetrics) Error() {
	if a != nil {
		a.m.asErrors.Inc()
	}
}

// Leader records whether this autoscaler is the leader.
func (a *AutoscalerMetrics) Leader(is bool) {
	if a == nil {
		return
	}
	v := 0.0
	if is {
		v = 1
	}
	a.m.leader.Set(v)
}
