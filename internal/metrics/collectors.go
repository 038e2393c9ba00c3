package metrics

import (
	"sort"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// shardCollector reports the runtimes' shards when scraped: nothing is kept up to date on the hot
// path for it.
type shardCollector struct {
	shards, pending, step, cores *prometheus.Desc

	mu      sync.Mutex // guards sources
	sources map[*RuntimeMetrics]source
}

type source struct {
	cores  int
	shards func(yield func(ShardGauge))
}

func (c *shardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.shards
	ch <- c.pending
	ch <- c.step
	ch <- c.cores
}

func (c *shardCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	type entry struct {
		id string
		source
	}
	var srcs []entry
	for r, s := range c.sources {
		srcs = append(srcs, entry{r.id, s})
	}
	c.mu.Unlock()
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].id < srcs[j].id })
	type agg struct {
		shards  int
		pending uint64
		step    int64
	}
	seen := map[string]bool{}
	for _, s := range srcs {
		if seen[s.id] {
			continue
		}
		seen[s.id] = true
		ch <- prometheus.MustNewConstMetric(c.cores, prometheus.GaugeValue, float64(s.cores), s.id)
		jobs := map[string]*agg{}
		s.shards(func(g ShardGauge) {
			a := jobs[g.Job]
			if a == nil {
				a = &agg{step: g.Step}
				jobs[g.Job] = a
			}
			a.shards++
			a.pending += g.Pending
			a.step = min(a.step, g.Step)
		})
		for job, a := range jobs {
			ch <- prometheus.MustNewConstMetric(c.shards, prometheus.GaugeValue, float64(a.shards), s.id, job)
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(a.pending), s.id, job)
			ch <- prometheus.MustNewConstMetric(c.step, prometheus.GaugeValue, float64(a.step), s.id, job)
		}
	}
}

// connCollector reports the state of the NATS connections given to WatchConn.
type connCollector struct {
	connected, reconnects *prometheus.Desc

	mu    sync.Mutex // guards conns
	conns map[*connEntry]struct{}
}

type connEntry struct {
	name string
	nc   *nats.Conn
}

func (c *connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connected
	ch <- c.reconnects
}

func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	entries := make([]*connEntry, 0, len(c.conns))
	for e := range c.conns {
		entries = append(entries, e)
	}
	c.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	seen := map[string]bool{}
	for _, e := range entries {
		if seen[e.name] {
			continue
		}
		seen[e.name] = true
		up := 0.0
		if e.nc.IsConnected() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up, e.name)
		ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(e.nc.Stats().Reconnects), e.name)
	}
}

// WatchConn reports the state of nc under the label connection=name (fanin_nats_connected,
// fanin_nats_reconnects_total) until the returned function is called. Names should be unique in
// the process; a repeated name is reported once.
func (m *Metrics) WatchConn(name string, nc *nats.Conn) (stop func()) {
	if m == nil || nc == nil {
		return func() {}
	}
	e := &connEntry{name: name, nc: nc}
	m.conns.mu.Lock()
	m.conns.conns[e] = struct{}{}
	m.conns.mu.Unlock()
	return func() {
		m.conns.mu.Lock()
		delete(m.conns.conns, e)
		m.conns.mu.Unlock()
	}
}
