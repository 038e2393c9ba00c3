package runtime

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fanin-ml/fanin/wire"
)

// shardStats are a shard's load signals: exponentially weighted averages over its recent steps.
// Guarded by the shard's mu.
type shardStats struct {
	stepStart time.Time     // first gradient of the open step
	lastDone  time.Time     // when the previous step was applied
	work      time.Duration // CPU time of the open step so far
	apply     time.Duration // of which in the update
	wait      time.Duration // time the open step's messages waited for a core

	avgWork, avgApply, avgWait, avgPeriod, avgBurst float64 // seconds
	phase                                           time.Duration
	pending                                         uint64

	stepIn  int64   // gradient bytes received in the open step
	avgIn   float64 // gradient bytes per step
	outStep int64   // parameter bytes published per step (set by loadSignals)
}

// received counts n gradient bytes into the open step.
func (s *shardStats) received(n int) { s.stepIn += int64(n) }

// rates are the shard's bytes in and out per second: its bytes per step over its period; 0 while
// the period is not known.
func (s *shardStats) rates() (in, out float64) {
	if s.avgPeriod <= 0 {
		return 0, 0
	}
	return s.avgIn / s.avgPeriod, float64(s.outStep) / s.avgPeriod
}

// ewmaWeight is the weight of the newest step in the averages.
const ewmaWeight = 0.3

func ewma(avg, v float64) float64 {
	if avg == 0 {
		return v
	}
	return avg + ewmaWeight*(v-avg)
}

// addWork counts a gradient's time waiting for a core and on it, apply of which in the update.
func (s *shardStats) addWork(wait, work, apply time.Duration) {
	s.wait += wait
	s.work += work
	s.apply += apply
}

// stepDone folds the step that just completed into the averages. It reports whether they just
// became known: after a shard's first step (its work) and second (its period), when the
// autoscaler should hear of them without waiting for the next periodic report.
func (s *shardStats) stepDone(now time.Time) (news bool) {
	news = s.avgWork == 0 || (s.avgPeriod == 0 && !s.lastDone.IsZero())
	s.avgWork = ewma(s.avgWork, s.work.Seconds())
	s.avgApply = ewma(s.avgApply, s.apply.Seconds())
	s.avgWait = ewma(s.avgWait, s.wait.Seconds())
	s.avgIn = ewma(s.avgIn, float64(s.stepIn))
	if !s.stepStart.IsZero() {
		s.avgBurst = ewma(s.avgBurst, now.Sub(s.stepStart).Seconds())
	}
	if !s.lastDone.IsZero() {
		s.avgPeriod = ewma(s.avgPeriod, now.Sub(s.lastDone).Seconds())
		if p := seconds(s.avgPeriod); p > 0 && !s.stepStart.IsZero() {
			s.phase = time.Duration(s.stepStart.UnixNano() % int64(p))
		}
	}
	s.lastDone, s.work, s.apply, s.wait, s.stepIn = now, 0, 0, 0, 0
	return news
}

// reportGap is the least time between two load reports: the signals of many shards that start at
// once go out together.
const reportGap = 100 * time.Millisecond

// loadEvery is the interval of the periodic load reports (Run). Tests lengthen it (export_test.go).
var loadEvery atomic.Int64

func init() { loadEvery.Store(int64(time.Second)) }

// reportSoon asks for a load report ahead of the periodic one. It never blocks.
func (r *Runtime) reportSoon() {
	select {
	case r.hurry <- struct{}{}:
	default:
	}
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// loadSignals reports the shard's signals, and whether its work is timed in the runtime's
// workNanos (not ssp's or asp's).
func (x *shardExec) loadSignals() (_ wire.ShardLoad, timed bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	// Every applied step publishes the shard's parameters once, in the job's param_dtype.
	x.stats.outStep = int64(x.shard.Len) * int64(x.paramsDt.ElemSize())
	in, out := x.stats.rates()
	return wire.ShardLoad{
		Key: x.key, Job: x.ji.rec.Spec.ID, Step: x.step,
		Bytes:          int64(x.ranks) * int64(x.shard.Bytes()),
		Work:           x.stats.avgWork,
		Apply:          x.stats.avgApply,
		Period:         seconds(x.stats.avgPeriod),
		Phase:          x.stats.phase,
		Burst:          seconds(x.stats.avgBurst),
		QueueWait:      seconds(x.stats.avgWait),
		Pending:        x.stats.pending,
		BytesInPerSec:  in,
		BytesOutPerSec: out,
	}, x.sync.mode == modeBSP
}

// where is the runtime's node and NATS server, for its load reports: the server's name changes
// when the connection moves to another server, and with it the node unless it is labelled.
func (r *Runtime) where() (node, server string) {
	server = r.nc.ConnectedServerName()
	if node = r.node; node == "" {
		node = server
	}
	return node, server
}

// report publishes the runtime's LoadReport every interval, and reportGap after reportSoon asks
// for one, until ctx is done. A burst of new jobs reaches the autoscaler in about reportGap, not
// in up to an interval.
func (r *Runtime) report(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastWork, lastBytes int64
	var nsPerByte float64
	var over overhead
	if r.processCPU != nil {
		over.start(r.processCPU(), r.stats.workNanos.Load(), time.Now())
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.hurry:
			select { // let the shards that start together finish their steps too
			case <-ctx.Done():
				return
			case <-time.After(reportGap):
			}
			t.Reset(interval)
		}
		work, bytes := r.stats.workNanos.Load(), r.stats.bytesIn.Load()
		if db := bytes - lastBytes; db > 0 {
			nsPerByte = ewma(nsPerByte, float64(work-lastWork)/float64(db))
		}
		lastWork, lastBytes = work, bytes
		if r.processCPU != nil {
			over.observe(r.processCPU(), work, time.Now())
		}
		node, server := r.where()
		rep := wire.LoadReport{Runtime: r.id, Cores: r.cores, At: r.now().UTC(), NanosPerByte: nsPerByte,
			Node: node, Server: server, NICBytesPerSec: r.nic, Overhead: over.factor}
		for _, x := range r.shardExecs() {
			sl, timed := x.loadSignals()
			if !timed {
				// Its work is not in workNanos: its CPU would be put down to the other shards.
				rep.Overhead = 0
			}
			rep.Shards = append(rep.Shards, sl)
		}
		data, _ := json.Marshal(rep)
		_ = r.nc.Publish(wire.LoadSubject(r.id), data)
	}
}

// overhead follows a runtime process's CPU time per unit of its shards' work (wire.LoadReport's
// Overhead), from one reading to the next (a load report's interval). A runtime spends CPU when it
// has no work at all (heartbeats, its placement watch, idle consumers): that is the runtime's own
// cost, not its shards', so it is learnt from the intervals without work, as CPU per second, and
// taken off the others. Such an interval may still hold the tail of work (a publish, a snapshot
// after a step): the least rate seen is kept, not an average. The first interval after the start
// (the restores of the shards placed on it) is not read. An interval with work but less than
// minOverheadWork says too little and is skipped; each interval's ratio is kept within 1 and
// maxOverhead, and the overhead is the median of the last few, so that one interval of a shard
// restored or handed over does not move it.
type overhead struct {
	cpu, work int64     // at the last reading, in nanoseconds
	at        time.Time // when it was taken
	readings  int
	idle      float64 // least CPU seconds per second with no work; < 0 until seen
	recent    []float64
	factor    float64
}

// minOverheadWork is an interval's least work, in nanoseconds, for an overhead (tests lower it:
// export_test.go).
var minOverheadWork atomic.Int64

func init() { minOverheadWork.Store(int64(20 * time.Millisecond)) }

const (
	maxOverhead    = 10
	overheadWindow = 5 // intervals the median is taken over
)

func (o *overhead) start(cpu time.Duration, work int64, at time.Time) {
	o.cpu, o.work, o.at, o.idle = int64(cpu), work, at, -1
}

func (o *overhead) observe(cpu time.Duration, work int64, at time.Time) {
	dc, dw, dt := float64(int64(cpu)-o.cpu), work-o.work, at.Sub(o.at).Seconds()
	o.cpu, o.work, o.at = int64(cpu), work, at
	if o.readings++; o.readings == 1 || dt <= 0 {
		return
	}
	switch {
	case dw == 0:
		if r := max(dc, 0) / 1e9 / dt; o.idle < 0 || r < o.idle {
			o.idle = r
		}
	case dw >= minOverheadWork.Load():
		f := (dc - max(o.idle, 0)*dt*1e9) / float64(dw)
		o.recent = append(o.recent, min(max(f, 1), maxOverhead))
		if len(o.recent) > overheadWindow {
			o.recent = o.recent[1:]
		}
		sorted := slices.Sorted(slices.Values(o.recent))
		o.factor = sorted[len(sorted)/2]
	}
}
