package runtime

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanin-ml/fanin/wire"
)

// Stats are a runtime's counters since it started.
type Stats struct {
	invocations atomic.Int64
	bytesIn     atomic.Int64
	fnNanos     atomic.Int64
	workNanos   atomic.Int64 // fold and function
	migrations  atomic.Int64 // shards received from another runtime
	failedStart atomic.Int64 // shard starts that failed and are retried
	replyDrops  atomic.Int64 // rejection reports not sent: Fanin-Reply-To outside the job

	mu     sync.Mutex      // guards pauses
	pauses []time.Duration // the latest migration pauses, at most maxPauses
}

const maxPauses = 4096

func (s *Stats) addPause(d time.Duration) {
	s.migrations.Add(1)
	s.mu.Lock()
	if len(s.pauses) == maxPauses {
		copy(s.pauses, s.pauses[1:])
		s.pauses = s.pauses[:maxPauses-1]
	}
	s.pauses = append(s.pauses, d)
	s.mu.Unlock()
}

// StatsSnapshot is a copy of the counters.
type StatsSnapshot struct {
	Invocations  int64                 // shard updates applied
	BytesIn      int64                 // gradient bytes accepted
	FuncTime     time.Duration         // time spent in the function
	WorkTime     time.Duration         // time the shards held a core: fold and function (the load reports' Work)
	Rejects      map[wire.Reason]int64 // rejected inputs by reason
	Migrations   int64                 // shards taken over from another runtime after its release
	Pauses       []time.Duration       // their pauses: previous owner stopped to this one serving
	StartRetries int64                 // shard starts that failed and were retried
	ReplyDrops   int64                 // rejection reports not sent: Fanin-Reply-To outside the job
}

// Stats returns the runtime's counters.
func (r *Runtime) Stats() StatsSnapshot {
	r.stats.mu.Lock()
	pauses := append([]time.Duration(nil), r.stats.pauses...)
	r.stats.mu.Unlock()
	return StatsSnapshot{
		Migrations:   r.stats.migrations.Load(),
		StartRetries: r.stats.failedStart.Load(),
		ReplyDrops:   r.stats.replyDrops.Load(),
		Pauses:       pauses,
		Invocations:  r.stats.invocations.Load(),
		BytesIn:      r.stats.bytesIn.Load(),
		FuncTime:     time.Duration(r.stats.fnNanos.Load()),
		WorkTime:     time.Duration(r.stats.workNanos.Load()),
		Rejects:      r.rejects.counts(),
	}
}

// rejectLog counts rejections by job and reason and logs each cause at most once per interval.
type rejectLog struct {
	log      *slog.Logger
	now      func() time.Time
	interval time.Duration

	mu     sync.Mutex // guards the maps
	byCode map[wire.Reason]int64
	last   map[string]time.Time // job/reason -> when last logged
	quiet  map[string]int64     // job/reason -> rejections not logged since
}

func newRejectLog(log *slog.Logger, now func() time.Time) *rejectLog {
	return &rejectLog{
		log: log, now: now, interval: 10 * time.Second,
		byCode: make(map[wire.Reason]int64), last: make(map[string]time.Time), quiet: make(map[string]int64),
	}
}

func (l *rejectLog) add(rej *wire.Reject) {
	key := rej.Job + "/" + string(rej.Reason)
	now := l.now()
	l.mu.Lock()
	l.byCode[rej.Reason]++
	logIt := now.Sub(l.last[key]) >= l.interval
	suppressed := l.quiet[key]
	if logIt {
		l.last[key] = now
		l.quiet[key] = 0
	} else {
		l.quiet[key]++
	}
	l.mu.Unlock()
	if logIt {
		l.log.Warn("input rejected", "job", rej.Job, "shard", rej.Shard, "step", rej.Step, "rank", rej.Rank,
			"reason", rej.Reason, "detail", rej.Detail, "suppressed_since_last", suppressed)
	}
}

func (l *rejectLog) counts() map[wire.Reason]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[wire.Reason]int64, len(l.byCode))
	for k, v := range l.byCode {
		m[k] = v
	}
	return m
}

// reject counts and logs a rejection, tells the sender if it gave a Fanin-Reply-To inside its job's
// reply namespace (wire.ValidReplyTo; any other is dropped and counted), and publishes it on the
// job's rejects subject for observers.
//
// incarnation names the job's incarnation (its id and creation time: jobInfo.incarnation): the
// counts announced with each rejection are per incarnation, so a job deleted and created again
// under the same id counts from zero.
func (r *Runtime) reject(rej *wire.Reject, replyTo, incarnation string) {
	r.rejects.add(rej)
	r.met.Reject(rej.Job, string(rej.Reason))
	if replyTo != "" && !wire.ValidReplyTo(rej.Job, replyTo) {
		// fanin publishes to a subject a client chose only inside that job's reply namespace.
		r.met.ReplyDropped(rej.Job)
		r.stats.replyDrops.Add(1)
		replyTo = ""
	}
	if replyTo != "" {
		_ = r.nc.PublishMsg(rej.ReplyMsg(replyTo)) // best effort: the sender may be gone
	}
	if rej.Job != "" {
		_ = r.nc.PublishMsg(rej.ReportMsg(r.origin, r.tally.Add(incarnation, rej.Reason)))
	}
}
