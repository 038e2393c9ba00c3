// Package dashboard is fanin's live web dashboard: an http.Handler that serves a page from embedded
// static files and the JSON it polls, built from what fanin's components publish in JetStream (jobs,
// their elastic workers, runtimes, placement, load reports, autoscaler decisions, rejects).
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

//go:embed static
var static embed.FS

// Routes the dashboard serves; mount the Dashboard on both patterns.
const (
	RootPattern   = "GET /{$}"        // the page
	PrefixPattern = "GET /dashboard/" // its files (/dashboard/app.js, ...) and its JSON (/dashboard/api/state)
	// StatePattern is its JSON alone: a server that shows each caller its own view of the state
	// (State.Public, State.Only) mounts its handler there, over PrefixPattern's.
	StatePattern = "GET /dashboard/api/state"
)

// Limits of what the dashboard keeps in memory.
const (
	historyLen   = 900 // pool samples, one per second: 15 minutes
	maxDecisions = 50
	maxRejects   = 100
)

// Dashboard serves the web dashboard. It watches fanin's state in JetStream from New until Close:
// jobs, placement, runtimes and load reports through a view.View (its own, or its caller's), the
// autoscaler's decisions and the rejects by its own subscriptions.
type Dashboard struct {
	js      jetstream.JetStream
	nc      *nats.Conn
	log     *slog.Logger
	now     func() time.Time
	every   time.Duration
	mux     *http.ServeMux
	view    *view.View
	ownView bool // the dashboard opened view, and closes it

	cancel context.CancelFunc
	wg     sync.WaitGroup // the sampler
	subs   []*nats.Subscription

	mu        sync.Mutex            // guards everything below
	decisions []autoscaler.Decision // oldest first
	rejects   []wire.Reject         // oldest first
	rejectAt  []time.Time           // when each of rejects arrived
	counts    map[[2]string]int64   // {job, reason} -> rejects seen since start
	history   []Sample              // oldest first
}

// Option configures a Dashboard.
type Option func(*Dashboard) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(d *Dashboard) error { d.log = l; return nil } }

// WithSampleInterval sets how often the pool's history is sampled (default 1s).
func WithSampleInterval(every time.Duration) Option {
	return func(d *Dashboard) error {
		if every <= 0 {
			return fmt.Errorf("dashboard: sample interval must be > 0, got %v", every)
		}
		d.every = every
		return nil
	}
}

// WithView reads jobs, placement, runtimes and load reports from v, which the caller opened and
// closes after the dashboard (the gateway shares its own), instead of opening a view of its own.
func WithView(v *view.View) Option { return func(d *Dashboard) error { d.view = v; return nil } }

// New starts watching fanin's state over nc and returns the dashboard. ctx bounds the setup only
// (opening the buckets, the first reads); the dashboard runs until Close. Options: WithLogger,
// WithSampleInterval, WithView.
func New(ctx context.Context, nc *nats.Conn, opts ...Option) (_ *Dashboard, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	d := &Dashboard{
		js: js, nc: nc, log: slog.Default(), now: time.Now, every: time.Second, mux: http.NewServeMux(),
		counts: map[[2]string]int64{}, cancel: func() {},
	}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	files, _ := fs.Sub(static, "static")
	d.mux.HandleFunc(RootPattern, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, files, "index.html")
	})
	d.mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard/", http.FileServerFS(files)))
	d.mux.HandleFunc(StatePattern, d.serveState)

	if d.view == nil {
		if d.view, err = view.Open(ctx, nc, view.WithLogger(d.log)); err != nil {
			return nil, fmt.Errorf("dashboard: %w", err)
		}
		d.ownView = true
	}
	wctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	d.loadDecisions(ctx)
	for subj, fn := range map[string]nats.MsgHandler{
		wire.DecisionsSubject:     d.onDecision,
		wire.Prefix + "*.rejects": d.onReject,
	} {
		sub, serr := nc.Subscribe(subj, fn)
		if serr != nil {
			err = fmt.Errorf("dashboard: subscribe %s: %w", subj, serr)
			return nil, err
		}
		d.subs = append(d.subs, sub)
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTicker(d.every)
		defer t.Stop()
		d.sample()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				d.sample()
			}
		}
	}()
	return d, nil
}

// Close stops watching and waits for the sampler (and its own view's watchers). The handler
// keeps serving the last state.
func (d *Dashboard) Close() {
	d.cancel()
	d.mu.Lock()
	subs := d.subs
	d.subs = nil
	d.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	d.wg.Wait()
	if d.ownView {
		d.view.Close()
	}
}

// ServeHTTP serves the page at /, its files under /dashboard/ and its JSON at /dashboard/api/state.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.mux.ServeHTTP(w, r) }

// loadDecisions reads the latest decisions kept by the decisions stream, if there is one yet.
func (d *Dashboard) loadDecisions(ctx context.Context) {
	st, err := d.js.Stream(ctx, wire.DecisionsStream)
	if err != nil {
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			d.log.Warn("dashboard: decisions stream", "err", err)
		}
		return
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		return
	}
	first := info.State.FirstSeq
	if last := info.State.LastSeq; last >= maxDecisions && last-maxDecisions+1 > first {
		first = last - maxDecisions + 1
	}
	for seq := first; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil || m.Subject != wire.DecisionsSubject {
			continue // purged, a gap, or the leaders' fence
		}
		d.addDecision(m.Data)
	}
}

func (d *Dashboard) onDecision(m *nats.Msg) { d.addDecision(m.Data) }

func (d *Dashboard) addDecision(data []byte) {
	var dec autoscaler.Decision
	if json.Unmarshal(data, &dec) != nil {
		return
	}
	dec.Placement = nil // the placement bucket says it; the dashboard keeps the why
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.decisions); n > 0 && !dec.At.After(d.decisions[n-1].At) {
		return // already read from the stream
	}
	d.decisions = append(d.decisions, dec)
	if len(d.decisions) > maxDecisions {
		d.decisions = d.decisions[len(d.decisions)-maxDecisions:]
	}
}

func (d *Dashboard) onReject(m *nats.Msg) {
	rej, err := wire.UnmarshalReject(m.Data)
	if err != nil {
		return
	}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts[[2]string{rej.Job, string(rej.Reason)}]++
	d.rejects = append(d.rejects, *rej)
	d.rejectAt = append(d.rejectAt, now)
	if len(d.rejects) > maxRejects {
		d.rejects = d.rejects[len(d.rejects)-maxRejects:]
		d.rejectAt = d.rejectAt[len(d.rejectAt)-maxRejects:]
	}
}

// Sample is one point of the pool's history.
type Sample struct {
	At       int64 `json:"t"`        // Unix milliseconds
	Runtimes int   `json:"runtimes"` // live runtimes
	Cores    int   `json:"cores"`    // their cores
	Desired  int   `json:"desired"`  // the autoscaler's latest wanted size (0: no decision yet)
	// DesiredCores is Desired in cores, at the pool's mean cores per runtime: comparable with Cores.
	DesiredCores float64 `json:"desired_cores"`
	Demand       float64 `json:"demand"` // cores the load needs at its peak, per the latest decision
	Busy         float64 `json:"busy"`   // cores busy on average: the shards' work per step over their period
}

// sample records the pool's size and load for the history.
func (d *Dashboard) sample() {
	now := d.now()
	snap := d.view.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := Sample{At: now.UnixMilli()}
	for id, rt := range snap.Runtimes {
		if !rt.Alive(now) {
			continue
		}
		s.Runtimes++
		s.Cores += max(1, rt.Cores)
		for _, sh := range snap.Loads[id].Shards {
			if sh.Period > 0 {
				s.Busy += sh.Work / sh.Period.Seconds()
			}
		}
	}
	if n := len(d.decisions); n > 0 {
		s.Desired, s.Demand = d.decisions[n-1].Desired, d.decisions[n-1].Demand
		if s.Runtimes > 0 {
			s.DesiredCores = float64(s.Desired) * float64(s.Cores) / float64(s.Runtimes)
		}
	}
	d.history = append(d.history, s)
	if len(d.history) > historyLen {
		d.history = d.history[len(d.history)-historyLen:]
	}
}

// jobStep is the last step applied to every shard of the job, from the runtimes' load reports.
func jobStep(id string, rec job.Record, loads map[string]view.Load) (int64, bool) {
	seen := 0
	step := int64(-1)
	for _, l := range loads {
		for _, sh := range l.Shards {
			if sh.Job == id {
				seen++
				if step < 0 || sh.Step < step {
					step = sh.Step
				}
			}
		}
	}
	return step, seen > 0 && seen >= rec.Layout.NumShards()
}

// State is the JSON the page polls.
type State struct {
	Now       time.Time      `json:"now"`
	Connected bool           `json:"connected"`
	Anonymous bool           `json:"anonymous,omitempty"` // Public's view: no job's details
	Jobs      []JobView      `json:"jobs"`
	Runtimes  []RuntimeView  `json:"runtimes"`
	History   []Sample       `json:"history"`
	Decisions []DecisionView `json:"decisions"` // newest first
	Rejects   []RejectView   `json:"rejects"`   // newest first
	Counts    []RejectCount  `json:"reject_counts"`
}

// JobView is one job's row.
type JobView struct {
	ID          string  `json:"id"`
	Function    string  `json:"function,omitempty"`
	Sync        string  `json:"sync,omitempty"`
	Ranks       int     `json:"ranks,omitempty"`
	Shards      int     `json:"shards"`
	Bytes       int64   `json:"bytes,omitempty"` // parameters
	Created     string  `json:"created,omitempty"`
	Step        int64   `json:"step"` // -1: not reported yet
	StepsPerSec float64 `json:"steps_per_sec"`
	State       string  `json:"state"` // running, idle or waiting (not every shard served yet)
	Placed      int     `json:"placed"`
	Pending     uint64  `json:"pending"`
	Rejects     int64   `json:"rejects"`
	// The job's elastic workers, as the autoscaler leader last assigned them (wire.Assignment):
	// the target count from its record (0: every live worker), the assignment's epoch, the live
	// workers with their ranks, and the ranks none holds.
	TargetWorkers int          `json:"target_workers"`
	Epoch         uint64       `json:"epoch,omitempty"`
	Workers       []WorkerView `json:"workers"`
	Unassigned    []int        `json:"unassigned,omitempty"`
}

// WorkerView is one elastic worker of a job.
type WorkerView struct {
	ID        string  `json:"id"`
	Host      string  `json:"host,omitempty"`
	Ranks     []int   `json:"ranks"`
	Step      int64   `json:"step"`
	BeatAgeMs float64 `json:"beat_age_ms"` // since its last beat
	Standby   bool    `json:"standby,omitempty"`
}

// RuntimeView is one runtime with the shards placed on it.
type RuntimeView struct {
	ID       string      `json:"id"`
	Cores    int         `json:"cores"`
	Alive    bool        `json:"alive"`
	Busy     float64     `json:"busy"` // cores busy on average
	Uptime   string      `json:"uptime"`
	Shards   []ShardView `json:"shards"`
	Draining bool        `json:"draining"`
}

// ShardView is one placed shard.
type ShardView struct {
	Key     string  `json:"key"`
	Job     string  `json:"job"`
	Shard   string  `json:"shard"`
	Epoch   uint64  `json:"epoch"`
	Step    int64   `json:"step"`
	Pending uint64  `json:"pending"`
	Busy    float64 `json:"busy"`
}

// DecisionView is one decision of the autoscaler.
type DecisionView struct {
	At      time.Time         `json:"at"`
	Desired int               `json:"desired"`
	Mode    string            `json:"mode"`
	Demand  float64           `json:"demand"`
	Moves   []autoscaler.Move `json:"moves"`
	Drain   []string          `json:"drain"`
	Reasons []string          `json:"reasons"`
}

// RejectView is one rejected message.
type RejectView struct {
	At time.Time `json:"at"`
	wire.Reject
}

// RejectCount is how many messages of a job were rejected for a reason since the dashboard started.
type RejectCount struct {
	Job    string `json:"job"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// Snapshot is the current state, as served to the page.
func (d *Dashboard) Snapshot() State {
	now := d.now()
	snap := d.view.Snapshot()
	rates := map[string]float64{}
	for id, rec := range snap.Jobs {
		if !rec.Paused {
			rates[id] = d.view.JobRate(id)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := State{Now: now.UTC(), Connected: d.nc.IsConnected(), History: append([]Sample(nil), d.history...)}

	shardLoad := map[string]wire.ShardLoad{}
	for _, l := range snap.Loads {
		for _, s := range l.Shards {
			shardLoad[s.Key] = s
		}
	}
	rejectsOf := map[string]int64{}
	for k, n := range d.counts {
		rejectsOf[k[0]] += n
		st.Counts = append(st.Counts, RejectCount{Job: k[0], Reason: k[1], Count: n})
	}
	sort.Slice(st.Counts, func(i, j int) bool {
		a, b := st.Counts[i], st.Counts[j]
		return a.Job < b.Job || (a.Job == b.Job && a.Reason < b.Reason)
	})

	for id, rec := range snap.Jobs {
		if rec.Paused { // the dashboard shows the jobs placed, or to be
			continue
		}
		jv := JobView{ID: id, Function: rec.Spec.Function.Name, Sync: rec.Spec.Sync, Ranks: rec.Spec.Ranks,
			Shards: rec.Layout.NumShards(), Bytes: 4 * int64(rec.Layout.Elements), Created: rec.Created.UTC().Format(time.RFC3339),
			Step: -1, State: "waiting", Rejects: rejectsOf[id], TargetWorkers: rec.Workers, Workers: []WorkerView{}}
		if a, ok := snap.Assignments[id]; ok {
			jv.Epoch, jv.Unassigned = a.Epoch, a.Unassigned
			for _, w := range a.Workers {
				ranks := w.Ranks
				if ranks == nil {
					ranks = []int{}
				}
				jv.Workers = append(jv.Workers, WorkerView{ID: w.ID, Host: w.Host, Ranks: ranks, Step: w.Step,
					BeatAgeMs: max(0, float64(now.Sub(w.LastBeat))/float64(time.Millisecond)), Standby: w.Standby})
			}
		}
		for _, sh := range rec.Layout.Shards {
			key := wire.PlacementKey(id, sh.ID)
			if p, ok := snap.Placement[key]; ok && p.Runtime != "" {
				jv.Placed++
			}
			jv.Pending += shardLoad[key].Pending
		}
		if step, ok := jobStep(id, rec, snap.Loads); ok {
			jv.Step, jv.State = step, "idle"
		}
		if jv.StepsPerSec = rates[id]; jv.StepsPerSec > 0 { // view.JobRate: the slowest shard reported fresh
			jv.State = "running"
		}
		st.Jobs = append(st.Jobs, jv)
	}
	sort.Slice(st.Jobs, func(i, j int) bool { return st.Jobs[i].ID < st.Jobs[j].ID })

	draining := map[string]bool{}
	if n := len(d.decisions); n > 0 {
		for _, id := range d.decisions[n-1].Drain {
			draining[id] = true
		}
	}
	views := map[string]*RuntimeView{}
	for id, rt := range snap.Runtimes {
		rv := &RuntimeView{ID: id, Cores: rt.Cores, Alive: rt.Alive(now), Draining: draining[id],
			Uptime: now.Sub(rt.Started).Truncate(time.Second).String(), Shards: []ShardView{}}
		views[id] = rv
	}
	keys := make([]string, 0, len(snap.Placement))
	for k := range snap.Placement {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return lessKey(keys[i], keys[j]) })
	for _, key := range keys {
		p := snap.Placement[key]
		rv := views[p.Runtime]
		if rv == nil { // placed on a runtime that is gone: show it, so that the shard is seen waiting
			rv = &RuntimeView{ID: p.Runtime, Shards: []ShardView{}}
			views[p.Runtime] = rv
		}
		jobID, shard := splitKey(key)
		l := shardLoad[key]
		sv := ShardView{Key: key, Job: jobID, Shard: shard, Epoch: p.Epoch, Step: l.Step, Pending: l.Pending}
		if l.Period > 0 {
			sv.Busy = l.Work / l.Period.Seconds()
		}
		rv.Busy += sv.Busy
		rv.Shards = append(rv.Shards, sv)
	}
	for _, rv := range views {
		st.Runtimes = append(st.Runtimes, *rv)
	}
	sort.Slice(st.Runtimes, func(i, j int) bool { return lessKey(st.Runtimes[i].ID, st.Runtimes[j].ID) })

	for i := len(d.decisions) - 1; i >= 0; i-- {
		dec := d.decisions[i]
		st.Decisions = append(st.Decisions, DecisionView{At: dec.At, Desired: dec.Desired, Mode: dec.Mode, Demand: dec.Demand,
			Moves: dec.Moves, Drain: dec.Drain, Reasons: dec.Reasons})
	}
	for i := len(d.rejects) - 1; i >= 0; i-- {
		st.Rejects = append(st.Rejects, RejectView{At: d.rejectAt[i].UTC(), Reject: d.rejects[i]})
	}
	return st
}

// Public is the view anyone may have (docs/SECURITY.md): the jobs' ids, progress (step, rate,
// state, shards placed, pending messages) and counts of rejections, and the pool; not a job's
// function, ranks, size or elastic workers, nor any rejection's detail or reasons.
func (s State) Public() State {
	s.Anonymous = true
	jobs := make([]JobView, len(s.Jobs))
	for i, j := range s.Jobs {
		jobs[i] = JobView{ID: j.ID, Shards: j.Shards, Step: j.Step, StepsPerSec: j.StepsPerSec, State: j.State,
			Placed: j.Placed, Pending: j.Pending, Rejects: j.Rejects}
	}
	s.Jobs, s.Rejects, s.Counts = jobs, nil, nil
	return s
}

// Only keeps of s the jobs keep accepts: their rows, rejections and counts, and their shards on
// the runtimes (the pool's size, history and decisions stay).
func (s State) Only(keep func(job string) bool) State {
	var jobs []JobView
	for _, j := range s.Jobs {
		if keep(j.ID) {
			jobs = append(jobs, j)
		}
	}
	var rejects []RejectView
	for _, r := range s.Rejects {
		if keep(r.Job) {
			rejects = append(rejects, r)
		}
	}
	var counts []RejectCount
	for _, c := range s.Counts {
		if keep(c.Job) {
			counts = append(counts, c)
		}
	}
	runtimes := make([]RuntimeView, len(s.Runtimes))
	for i, rt := range s.Runtimes {
		shards := []ShardView{}
		rt.Busy = 0
		for _, sh := range rt.Shards {
			if keep(sh.Job) {
				shards = append(shards, sh)
				rt.Busy += sh.Busy
			}
		}
		rt.Shards = shards
		runtimes[i] = rt
	}
	s.Jobs, s.Rejects, s.Counts, s.Runtimes = jobs, rejects, counts, runtimes
	return s
}

// serveState serves the Snapshot as JSON.
func (d *Dashboard) serveState(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(d.Snapshot())
}

// splitKey splits a placement key <job>.<shard>.
func splitKey(key string) (job, shard string) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return key, ""
	}
	return key[:i], key[i+1:]
}

// lessKey orders keys with numeric suffixes naturally: rt-2 before rt-10, job.2 before job.10.
func lessKey(a, b string) bool {
	pa, na := splitNum(a)
	pb, nb := splitNum(b)
	if pa != pb {
		return pa < pb
	}
	if na != nb {
		return na < nb
	}
	return a < b
}

func splitNum(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n := 0
	for _, c := range s[i:] {
		n = n*10 + int(c-'0')
		if n > 1<<30 {
			return s, 0
		}
	}
	return s[:i], n
}
