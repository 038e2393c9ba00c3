package members_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/members"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// One job's flood of beats (600 a second, with 60 KB hosts and new ids) is refused with its
// reasons and bounded to the job's beat rate, before decoding; the other job's workers are taken
// and its assignment rewritten as if nothing happened; the flooding job's assignment stays small;
// and once the flood stops the flooding job's own worker gets its ranks. The clock is the test's:
// every beat and Tick happens at a time it sets.
func TestBeatFloodOfOneJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, b := natsBuckets(t, ctx)
	jobs := func() map[string]job.Record {
		return map[string]job.Record{
			"victim":   {Spec: job.Spec{ID: "victim", Ranks: 2}},
			"attacker": {Spec: job.Spec{ID: "attacker", Ranks: 2}},
		}
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	a := members.New(nc, b.Assign, jobs, func() bool { return true }, testutil.Logger()).WithClock(func() time.Time { return now })
	beat := func(jobID string, wb wire.WorkerBeat) *wire.Reject {
		data, _ := json.Marshal(wb)
		return a.Observe(wire.WorkersSubject(jobID), data)
	}
	read := func(jobID string) (wire.Assignment, int) {
		e, err := b.Assign.Get(ctx, jobID)
		if err != nil {
			return wire.Assignment{}, 0
		}
		var as wire.Assignment
		_ = json.Unmarshal(e.Value(), &as)
		return as, len(e.Value())
	}

	bigHost := strings.Repeat("h", 60_000)
	refused := map[wire.Reason]int{}
	var oversize, longHost *wire.Reject
	taken, sent := 0, 0
	const seconds = 20
	for tick := range seconds * 5 { // a Tick every 200 ms
		if tick%5 == 0 { // the victim's two workers beat once a second
			for _, id := range []string{"v0", "v1"} {
				if rej := beat("victim", wire.WorkerBeat{ID: id, Host: "node-1", Step: int64(tick / 5), Ranks: []int{}}); rej != nil {
					t.Fatalf("second %d: the victim's beat was refused: %v", tick/5, rej)
				}
			}
		}
		for i := range 120 { // 600 beats a second, each of a new id, half of them with a 60 KB host
			wb := wire.WorkerBeat{ID: fmt.Sprintf("x%d-%d", tick, i), Host: "node-2"}
			switch i % 4 {
			case 0, 2:
				wb.Host = bigHost
			case 1:
				wb.Host = bigHost[:1000]
			}
			sent++
			rej := beat("attacker", wb)
			if rej == nil {
				taken++
				continue
			}
			refused[rej.Reason]++
			switch {
			case rej.Reason != wire.ReasonBadBeat:
			case strings.Contains(rej.Detail, "a beat of 60"):
				oversize = rej
			case strings.Contains(rej.Detail, "a host of 1000 bytes"):
				longHost = rej
			}
		}
		a.Tick(ctx)
		// The victim's assignment: both workers, one rank each, rewritten at least every Refresh.
		as, _ := read("victim")
		if len(as.Workers) != 2 || len(as.Workers[0].Ranks) != 1 || len(as.Workers[1].Ranks) != 1 {
			t.Fatalf("second %.1f: the victim's assignment %+v", float64(tick)/5, as.Workers)
		}
		if age := now.Sub(as.Updated); age > members.Refresh {
			t.Fatalf("second %.1f: the victim's assignment is %v old", float64(tick)/5, age)
		}
		for _, w := range as.Workers {
			if age := now.Sub(w.LastBeat); age > members.Refresh+wire.BeatInterval {
				t.Fatalf("second %.1f: the victim's worker %s: beat age %v", float64(tick)/5, w.ID, age)
			}
		}
		now = now.Add(members.Interval)
	}
	// Taken: at most the job's beat rate over the flood, plus its burst.
	rate := wire.JobBeatRate(2)
	if max := int(rate*seconds + 2*rate); taken > max {
		t.Fatalf("%d of the attacker's %d beats taken, beyond its rate (at most %d)", taken, sent, max)
	}
	if refused[wire.ReasonBeatRate] == 0 || oversize == nil || longHost == nil {
		t.Fatalf("the attacker's refusals: %v", refused)
	}
	if !strings.Contains(oversize.Detail, "bytes: at most 32768 are taken") || oversize.Job != "attacker" {
		t.Fatalf("an oversize beat's refusal: %+v", oversize)
	}
	if !strings.Contains(longHost.Detail, "a host of 1000 bytes: at most 253") || longHost.Job != "attacker" {
		t.Fatalf("a long host's refusal: %+v", longHost)
	}
	if got := a.Refused("attacker"); got[wire.ReasonBeatRate] != int64(refused[wire.ReasonBeatRate]) || got[wire.ReasonBadBeat] != int64(refused[wire.ReasonBadBeat]) {
		t.Fatalf("counted refusals %v, returned %v", got, refused)
	}
	if got := a.Refused("victim"); len(got) != 0 {
		t.Fatalf("the victim's beats refused: %v", got)
	}
	as, size := read("attacker")
	if size == 0 || size > 64<<10 {
		t.Fatalf("the attacker's assignment: %d bytes, %d workers", size, len(as.Workers))
	}
	t.Logf("attacker: %d beats sent, %d taken, refused %v; its assignment %d bytes (%d workers)", sent, taken, refused, size, len(as.Workers))

	// One worker beating too fast is held to its own rate.
	now = now.Add(wire.WorkerLapse) // the flood's workers lapse
	fast := 0
	for range 20 {
		if rej := beat("attacker", wire.WorkerBeat{ID: "a0", Host: "node-2"}); rej != nil && rej.Reason == wire.ReasonBeatRate {
			fast++
		}
	}
	if fast != 20-wire.WorkerBeatBurst-1 { // its first beat, then its burst
		t.Fatalf("%d of one worker's 20 beats at once refused", fast)
	}
	// The flood over, the attacker's own worker holds its job's ranks.
	for range 5 {
		now = now.Add(members.Interval)
		a.Tick(ctx)
	}
	now = now.Add(time.Second)
	if rej := beat("attacker", wire.WorkerBeat{ID: "a0", Host: "node-2"}); rej != nil {
		t.Fatalf("the attacker's worker after the flood: %v", rej)
	}
	a.Tick(ctx)
	if as, _ := read("attacker"); len(as.Workers) != 1 || fmt.Sprint(as.Workers[0].Ranks) != "[0 1]" {
		t.Fatalf("the attacker's assignment after the flood: %+v", as.Workers)
	}
}

// slowKV holds the writes of one key until released.
type slowKV struct {
	jetstream.KeyValue
	key     string
	entered chan struct{} // closed by the first write of key
	release chan struct{} // closed by the test
	once    sync.Once
}

func (k *slowKV) hold(key string) {
	if key == k.key {
		k.once.Do(func() { close(k.entered) })
		<-k.release
	}
}

func (k *slowKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	k.hold(key)
	return k.KeyValue.Create(ctx, key, value, opts...)
}

func (k *slowKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	k.hold(key)
	return k.KeyValue.Update(ctx, key, value, rev)
}

// While one job's assignment write hangs, the other job's is written, and beats are taken.
func TestSlowWriteOfOneJobHoldsNoOther(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, b := natsBuckets(t, ctx)
	kv := &slowKV{KeyValue: b.Assign, key: "slow", entered: make(chan struct{}), release: make(chan struct{})}
	jobs := func() map[string]job.Record {
		return map[string]job.Record{"slow": {Spec: job.Spec{ID: "slow", Ranks: 1}}, "fast": {Spec: job.Spec{ID: "fast", Ranks: 1}}}
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	a := members.New(nc, kv, jobs, func() bool { return true }, testutil.Logger()).WithClock(func() time.Time { return now })
	for _, id := range []string{"slow", "fast"} {
		data, _ := json.Marshal(wire.WorkerBeat{ID: "w-" + id})
		if rej := a.Observe(wire.WorkersSubject(id), data); rej != nil {
			t.Fatal(rej)
		}
	}
	ticked := make(chan struct{})
	go func() { defer close(ticked); a.Tick(ctx) }()
	<-kv.entered
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, err := b.Assign.Get(ctx, "fast"); err != nil {
			return fmt.Errorf("the fast job's assignment, while the slow one's write hangs: %v", err)
		}
		return nil
	})
	data, _ := json.Marshal(wire.WorkerBeat{ID: "w2"})
	if rej := a.Observe(wire.WorkersSubject("fast"), data); rej != nil {
		t.Fatal(rej)
	}
	close(kv.release)
	<-ticked
	if _, err := b.Assign.Get(ctx, "slow"); err != nil {
		t.Fatalf("the slow job's assignment once released: %v", err)
	}
}

// A beat of a job created since the last Tick is taken: the Assigner looks at the jobs again
// (at most every 100 ms), instead of refusing the new job's first beats as unknown.
func TestBeatOfANewJob(t *testing.T) {
	t.Parallel()
	var jobs atomic.Value
	jobs.Store(map[string]job.Record{})
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	a := members.New(nil, nil, func() map[string]job.Record { return jobs.Load().(map[string]job.Record) },
		func() bool { return false }, testutil.Logger()).WithClock(func() time.Time { return now })
	data, _ := json.Marshal(wire.WorkerBeat{ID: "w0"})
	if rej := a.Observe(wire.WorkersSubject("new"), data); rej == nil || rej.Reason != wire.ReasonUnknownJob {
		t.Fatalf("a beat of no job: %v", rej)
	}
	jobs.Store(map[string]job.Record{"new": {Spec: job.Spec{ID: "new", Ranks: 1}}})
	now = now.Add(100 * time.Millisecond)
	if rej := a.Observe(wire.WorkersSubject("new"), data); rej != nil {
		t.Fatalf("a beat of a job created since: %v", rej)
	}
	if live := a.Live("new"); len(live) != 1 {
		t.Fatalf("live %+v", live)
	}
}
