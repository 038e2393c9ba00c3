package members

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"golang.org/x/sync/errgroup"

	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Timing of the leader's loop: it looks at the beats every Interval and rewrites an unchanged
// assignment every Refresh, so that readers see the workers' steps and beats move.
const (
	Interval = 200 * time.Millisecond
	Refresh  = 2 * time.Second
)

// MaxWorkersPerJob bounds the workers kept for one job: beats of further ids are refused, so that
// one job's credentials cannot grow the leader's memory without bound. (The job's beat rate,
// wire.JobBeatRate, bounds them further: a worker is kept only while it beats.)
const MaxWorkersPerJob = 4096

// refreshAtMost is how often a beat of a job not known yet makes the Assigner look at the jobs
// again between Ticks.
const refreshAtMost = 100 * time.Millisecond

// The leader writes at most writers assignments at once, each within writeTimeout.
const (
	writers      = 8
	writeTimeout = 2 * time.Second
)

// reportEvery is how often the refusals of one job for one reason are logged and reported on the
// job's rejects subject (with the exact counts since this replica started), and answered to a
// beat that asked for a reply: a flood of bad beats costs one report a second, not one per beat.
const reportEvery = time.Second

// Assigner follows every elastic worker's beats and, while its leader function says so, writes
// every job's assignment. Every autoscaler replica runs one, so a new leader knows the workers at
// once; only the leader writes.
type Assigner struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue
	jobs   func() map[string]job.Record
	leader func() bool
	now    func() time.Time
	log    *slog.Logger
	fence  func() Writer // nil: writes are compare-and-set on each key's revision

	origin string // this replica in wire.HdrRejectOrigin

	mu        sync.Mutex                    // guards the fields below
	beats     map[string]map[string]*Member // job -> worker id -> member
	left      map[string]map[string]bool    // job -> workers that said goodbye since this replica started
	started   time.Time                     // when beats began to be followed
	written   map[string]*written           // the leader's last write per job; nil while not leader
	known     map[string]*jobBeats          // the jobs whose beats are taken, refreshed every Tick
	refreshed time.Time                     // when known was last refreshed
	refused   map[string]map[wire.Reason]int64
	noJob     int64                 // beats refused because their job is not known
	report    map[refusal]time.Time // when each refusal was last reported
}

// jobBeats is what the Assigner keeps of a job to take its beats: its share of the beat rate.
type jobBeats struct {
	bucket *rate.Bucket
}

// refusal names what the refusals of a job are reported by.
type refusal struct {
	job    string
	reason wire.Reason
}

type written struct {
	a   *wire.Assignment
	rev uint64
	at  time.Time
}

// New returns an Assigner over the assignment bucket kv; jobs lists the jobs, leader says whether
// this replica may write.
func New(nc *nats.Conn, kv jetstream.KeyValue, jobs func() map[string]job.Record, leader func() bool, log *slog.Logger) *Assigner {
	if log == nil {
		log = slog.Default()
	}
	a := &Assigner{nc: nc, kv: kv, jobs: jobs, leader: leader, now: time.Now, log: log, origin: "members-" + nuid.Next(),
		beats: map[string]map[string]*Member{}, left: map[string]map[string]bool{}, known: map[string]*jobBeats{},
		refused: map[string]map[wire.Reason]int64{}, report: map[refusal]time.Time{}}
	a.refresh(jobs())
	return a
}

// WithClock sets the clock (tests).
func (a *Assigner) WithClock(now func() time.Time) *Assigner { a.now = now; return a }

// Writer writes the assignment bucket for the leader: the autoscaler's is fenced by its leadership
// term (store.Fence), so that a deposed leader's write is refused.
type Writer interface {
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Delete(ctx context.Context, key string) error
}

// WithFence makes every write go through the writer fence returns at the time (nil: not leader
// any more, nothing is written), instead of a compare-and-set on the key's revision.
func (a *Assigner) WithFence(fence func() Writer) *Assigner { a.fence = fence; return a }

func (a *Assigner) put(ctx context.Context, id string, data []byte, prev uint64) (uint64, error) {
	if a.fence != nil {
		w := a.fence()
		if w == nil {
			return 0, errors.New("not the leader")
		}
		return w.Put(ctx, id, data)
	}
	if prev != 0 {
		return a.kv.Update(ctx, id, data, prev)
	}
	return a.kv.Create(ctx, id, data)
}

func (a *Assigner) delete(ctx context.Context, id string) error {
	if a.fence != nil {
		w := a.fence()
		if w == nil {
			return errors.New("not the leader")
		}
		return w.Delete(ctx, id)
	}
	return a.kv.Delete(ctx, id)
}

// Run follows the beats and, while leader, assigns every Interval until ctx ends.
func (a *Assigner) Run(ctx context.Context) error {
	a.refresh(a.jobs())
	sub, err := a.nc.Subscribe(wire.WorkersWildcard, func(m *nats.Msg) {
		if rej := a.Observe(m.Subject, m.Data); rej != nil {
			a.reportRefusal(rej, m.Reply)
		}
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	// A flood beyond what the client holds is dropped by it (slow consumer), not queued without end.
	_ = sub.SetPendingLimits(64<<10, 64<<20)
	a.mu.Lock()
	a.started = a.now()
	a.mu.Unlock()
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.Tick(ctx)
		}
	}
}

// Observe takes one beat published on subject (wire.WorkersSubject of a job), or says why not:
// the job is unknown, its workers (or this worker) beat faster than wire.JobBeatRate (or
// wire.WorkerBeatRate), the beat breaks a bound (wire.DecodeBeat), or the job has
// MaxWorkersPerJob workers already. A job's excess beats are dropped before they are decoded,
// so one job's flood costs a map lookup per beat, and the other jobs' beats go on being taken.
func (a *Assigner) Observe(subject string, data []byte) *wire.Reject {
	jobID, ok := strings.CutPrefix(subject, wire.Prefix)
	if ok {
		jobID, ok = strings.CutSuffix(jobID, ".workers")
	}
	if !ok || strings.Contains(jobID, ".") {
		return wire.Rejectf(wire.ReasonBadBeat, "subject %.100q is not a job's beat subject", subject)
	}
	now := a.now()
	a.mu.Lock()
	jb := a.known[jobID]
	if since := now.Sub(a.refreshed); jb == nil && (since >= refreshAtMost || since < 0) {
		// A job created since the last Tick: look again, at most every refreshAtMost.
		a.mu.Unlock()
		a.refresh(a.jobs())
		a.mu.Lock()
		jb = a.known[jobID]
	}
	if jb == nil {
		a.noJob++
		a.mu.Unlock()
		return wire.Rejectf(wire.ReasonUnknownJob, "job %.100q: no such job", jobID)
	}
	if !jb.bucket.Allow(now, 1) {
		defer a.mu.Unlock()
		return a.refuseLocked(jobID, wire.Rejectf(wire.ReasonBeatRate,
			"job %s: its workers beat faster than %g a second (twice its ranks plus 16): beats dropped", jobID, jb.bucket.Rate))
	}
	a.mu.Unlock()
	b, rej := wire.DecodeBeat(data) // outside a.mu: the other jobs' beats are not held up by it
	a.mu.Lock()
	defer a.mu.Unlock()
	if rej != nil {
		return a.refuseLocked(jobID, rej)
	}
	ws := a.beats[jobID]
	if b.Leaving {
		delete(ws, b.ID)
		if a.left[jobID] == nil {
			a.left[jobID] = map[string]bool{}
		}
		if len(a.left[jobID]) < MaxWorkersPerJob {
			a.left[jobID][b.ID] = true
		}
		return nil
	}
	delete(a.left[jobID], b.ID) // back (a worker may leave and rejoin under its id)
	if ws == nil {
		ws = map[string]*Member{}
		a.beats[jobID] = ws
	}
	m := ws[b.ID]
	if m == nil {
		if len(ws) >= MaxWorkersPerJob {
			return a.refuseLocked(jobID, wire.Rejectf(wire.ReasonQuotaExceeded,
				"job %s has %d live workers, the most kept: worker %s is not taken", jobID, len(ws), b.ID))
		}
		m = &Member{Joined: now, bucket: rate.NewBucket(wire.WorkerBeatRate, wire.WorkerBeatBurst, 0, now)}
		ws[b.ID] = m
	} else if !m.bucket.Allow(now, 1) {
		return a.refuseLocked(jobID, wire.Rejectf(wire.ReasonBeatRate,
			"job %s: worker %s beats faster than %d a second: beats dropped", jobID, b.ID, wire.WorkerBeatRate))
	}
	m.Beat, m.Last = *b, now
	return nil
}

// refuseLocked counts a refused beat of a known job. a.mu is held.
func (a *Assigner) refuseLocked(jobID string, rej *wire.Reject) *wire.Reject {
	rej.Job = jobID
	c := a.refused[jobID]
	if c == nil {
		c = map[wire.Reason]int64{}
		a.refused[jobID] = c
	}
	c[rej.Reason]++
	return rej
}

// Refused returns how many beats of a job this replica refused, by reason.
func (a *Assigner) Refused(jobID string) map[wire.Reason]int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.refused[jobID])
}

// reportRefusal logs a refused beat and, while leader, reports it on the job's rejects subject
// (with this replica's counts of the job's refusals, so the gateway's counts stay exact) and
// answers it to reply (a beat sent as a request: across the job account's service import, reply
// is a subject the server made, which routes back to the job's account). Each of these is done at
// most once per reportEvery per job and reason; the refusals between are counted.
func (a *Assigner) reportRefusal(rej *wire.Reject, reply string) {
	if rej.Job == "" {
		return // not a known job: counted (noJob), nobody to tell
	}
	now := a.now()
	key := refusal{rej.Job, rej.Reason}
	a.mu.Lock()
	if last, ok := a.report[key]; ok && now.Sub(last) < reportEvery {
		a.mu.Unlock()
		return
	}
	a.report[key] = now
	counts := wire.FormatCounts(a.refused[rej.Job])
	a.mu.Unlock()
	a.log.Warn("elastic worker's beat refused", "job", rej.Job, "reason", rej.Reason, "detail", rej.Detail, "counts", counts)
	if !a.leader() {
		return
	}
	if strings.HasPrefix(reply, "_R_.") || wire.ValidReplyTo(rej.Job, reply) {
		_ = a.nc.PublishMsg(rej.ReplyMsg(reply))
	}
	_ = a.nc.PublishMsg(rej.ReportMsg(a.origin, counts))
}

// refresh sets the jobs whose beats are taken, and their beat rates, from jobs; the beats and
// counts of a job gone are dropped.
func (a *Assigner) refresh(jobs map[string]job.Record) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refreshed = now
	for id, rec := range jobs {
		r := wire.JobBeatRate(rec.Spec.Ranks)
		if jb := a.known[id]; jb != nil {
			jb.bucket.Rate, jb.bucket.Burst = r, 2*r
			continue
		}
		a.known[id] = &jobBeats{bucket: rate.NewBucket(r, 2*r, 0, now)}
	}
	for id := range a.known {
		if _, ok := jobs[id]; !ok {
			delete(a.known, id)
			delete(a.beats, id)
			delete(a.left, id)
			delete(a.refused, id)
			for k := range a.report {
				if k.job == id {
					delete(a.report, k)
				}
			}
		}
	}
}

// Live returns a job's live workers: beats within wire.WorkerLapse.
func (a *Assigner) Live(jobID string) []Member {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.liveLocked(jobID, now)
}

func (a *Assigner) liveLocked(jobID string, now time.Time) []Member {
	var out []Member
	for id, m := range a.beats[jobID] {
		if now.Sub(m.Last) >= wire.WorkerLapse {
			delete(a.beats[jobID], id)
			continue
		}
		out = append(out, *m)
	}
	return out
}

// Tick writes the assignment of every job whose workers changed, or whose assignment is older
// than Refresh, if this replica is the leader.
func (a *Assigner) Tick(ctx context.Context) {
	jobs := a.jobs()
	a.refresh(jobs)
	if !a.leader() {
		a.mu.Lock()
		a.written = nil
		a.mu.Unlock()
		return
	}
	now := a.now()
	a.mu.Lock()
	if a.written == nil {
		a.written = map[string]*written{}
		a.mu.Unlock()
		a.load(ctx, jobs)
		a.mu.Lock()
	}
	type todo struct {
		id   string
		prev *written
		next *wire.Assignment
	}
	var writes []todo
	for id, rec := range jobs {
		live := a.liveLocked(id, now)
		prev := a.written[id]
		if prev == nil && len(live) == 0 {
			continue
		}
		if prev != nil && now.Sub(a.started) < wire.WorkerLapse {
			// Just started following beats: a worker of the stored assignment may be alive and
			// not have beaten yet. Keep it until a whole lapse has passed.
			live = keepUnheard(live, prev.a, a.left[id])
		}
		var pa *wire.Assignment
		if prev != nil {
			pa = prev.a
		}
		next := Assign(id, rec.Spec.Ranks, rec.Workers, live, pa, now)
		if prev != nil && next.Epoch == prev.a.Epoch && now.Sub(prev.at) < Refresh && sameMembers(prev.a, next) {
			continue
		}
		writes = append(writes, todo{id, prev, next})
	}
	var gone []string
	for id := range a.written {
		if _, ok := jobs[id]; !ok {
			gone = append(gone, id)
		}
	}
	a.mu.Unlock()
	// One job's write, however slow, holds up no other's: they go in parallel, each with its
	// own deadline.
	var g errgroup.Group
	g.SetLimit(writers)
	for _, w := range writes {
		g.Go(func() error {
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			defer cancel()
			a.write(wctx, w.id, w.prev, w.next, now)
			return nil
		})
	}
	_ = g.Wait()
	for _, id := range gone {
		if err := a.delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			a.log.Warn("delete the assignment of a deleted job", "job", id, "err", err)
			continue
		}
		a.mu.Lock()
		delete(a.written, id)
		a.mu.Unlock()
	}
}

// load reads the stored assignments when this replica becomes the leader: epochs go on, and the
// ranks stay where they are.
func (a *Assigner) load(ctx context.Context, jobs map[string]job.Record) {
	keys, err := a.kv.ListKeys(ctx)
	if err != nil {
		a.log.Warn("list assignments", "err", err)
		return
	}
	for k := range keys.Keys() {
		if store.IsFence(k) {
			continue
		}
		e, err := a.kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var as wire.Assignment
		if json.Unmarshal(e.Value(), &as) != nil {
			continue
		}
		a.mu.Lock()
		if a.written != nil {
			a.written[k] = &written{a: &as, rev: e.Revision(), at: e.Created()}
		}
		a.mu.Unlock()
	}
}

func (a *Assigner) write(ctx context.Context, id string, prev *written, next *wire.Assignment, now time.Time) {
	data, err := json.Marshal(next)
	if err != nil {
		return
	}
	var prevRev uint64
	if prev != nil {
		prevRev = prev.rev
	}
	rev, err := a.put(ctx, id, data, prevRev)
	if err != nil {
		// Another writer (a previous leader) or a stale cache: read the stored value, outside
		// a.mu (beats of every job wait on it), and start from it next time.
		a.log.Debug("write assignment", "job", id, "err", err)
		e, gerr := a.kv.Get(ctx, id)
		var as wire.Assignment
		if gerr != nil || json.Unmarshal(e.Value(), &as) != nil {
			return
		}
		a.mu.Lock()
		if a.written != nil {
			a.written[id] = &written{a: &as, rev: e.Revision(), at: time.Time{}}
		}
		a.mu.Unlock()
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.written == nil {
		return
	}
	if prev == nil || prev.a.Epoch != next.Epoch {
		a.log.Info("assignment", "job", id, "epoch", next.Epoch, "workers", summary(next))
	}
	a.written[id] = &written{a: next, rev: rev, at: now}
}

// keepUnheard adds to live the workers of prev not heard from yet, as they were, except those
// that said goodbye.
func keepUnheard(live []Member, prev *wire.Assignment, left map[string]bool) []Member {
	seen := maps.Clone(left)
	if seen == nil {
		seen = map[string]bool{}
	}
	for _, m := range live {
		seen[m.Beat.ID] = true
	}
	for _, w := range prev.Workers {
		if !seen[w.ID] {
			live = append(live, Member{
				Beat:   wire.WorkerBeat{ID: w.ID, Host: w.Host, PID: w.PID, Step: w.Step, Ranks: w.Ranks},
				Joined: w.Joined, Last: w.LastBeat,
			})
		}
	}
	return live
}

// sameMembers reports whether a and b list the same workers in the same state of standby.
func sameMembers(a, b *wire.Assignment) bool {
	if len(a.Workers) != len(b.Workers) || a.Target != b.Target {
		return false
	}
	for i := range a.Workers {
		if a.Workers[i].ID != b.Workers[i].ID || a.Workers[i].Standby != b.Workers[i].Standby {
			return false
		}
	}
	return true
}

func summary(a *wire.Assignment) map[string][]int {
	m := map[string][]int{}
	for _, w := range a.Workers {
		m[w.ID] = w.Ranks
	}
	return m
}
