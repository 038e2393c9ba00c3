package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestBF16ParamsAcrossKill trains two jobs with param_dtype bf16 (docs/PROTOCOL.md, section 3,
// "16-bit parameters") on runtimes as processes: an sgd job whose ranks publish bf16 gradients
// and an adam job with f32 gradients. Their workers compute every step's gradients from the bf16
// parameters they were sent, so one wrong bit in the master parameters changes every later
// gradient. Mid-step, the runtime serving most of the sgd job's shards is SIGKILLed, then the one
// serving most of the adam job's, then another is stopped with SIGTERM (a migration: it
// checkpoints and hands its shards over). After every step, every worker's parameters are
// wire.Round(reference, bf16) of the reference fed the gradients the runtimes received; the
// stored parameters decode to the same; every checkpoint is f32 and holds the reference's f32
// parameters of its step; and once the runtimes are stopped, every shard's checkpoint holds those
// of the last step.
func TestBF16ParamsAcrossKill(t *testing.T) {
	t.Parallel()
	skipShort(t)
	c := startCluster(t, "rt-0", "rt-1")
	admin := sdk.NewAdmin(c.api)
	create := func(id, fn string) *job.Record {
		s := clusterSpec(id, fn)
		s.ParamDtype = wire.DtypeBF16
		rec, err := admin.CreateJob(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	sgdRec, adamRec := create("p16sgd", "sgd"), create("p16adam", "adam")
	sgd := newTrainer(t, c.url, sgdRec, wire.BF16, wire.BF16, wire.BF16, wire.BF16)
	adam := newTrainer(t, c.url, adamRec)
	jobs := map[*trainer]*job.Record{sgd: sgdRec, adam: adamRec}
	for tr, rec := range jobs { // step 0 is f32: the initial parameters as they are
		if !bytes.Equal(f32bytes(tr.params), f32bytes(testutil.Reference(t, rec).Params())) {
			t.Fatalf("%s: the step-0 parameters are not the f32 initial parameters", rec.Spec.ID)
		}
	}
	both := func(to int64) {
		sgd.run(to)
		adam.run(to)
	}
	// fault, armed for one step of one trainer: injects f on the test's goroutine while the
	// workers publish that step, then disarms.
	fault := func(tr *trainer, at int64, f func()) {
		tr.inStep = func(step int64) {
			if step == at {
				f()
				tr.inStep = nil
			}
		}
	}
	var faults []string
	kill := func(rec *job.Record, replacement string) func() {
		return func() {
			victim := busiest(t, c, rec)
			c.kill(victim)
			delete(c.runtimes, victim)
			faults = append(faults, fmt.Sprintf("SIGKILL %s (mid-step of %s)", victim, rec.Spec.ID))
			c.addRuntime(t, replacement)
		}
	}

	both(4)
	fault(sgd, 7, kill(sgdRec, "rt-2"))
	both(10)
	fault(adam, 13, kill(adamRec, "rt-3"))
	both(16)
	fault(sgd, 19, func() { // a migration: the runtime checkpoints and releases its shards
		victim := busiest(t, c, adamRec)
		c.runtimes[victim].stop(syscall.SIGTERM)
		delete(c.runtimes, victim)
		faults = append(faults, fmt.Sprintf("SIGTERM %s (mid-step of %s)", victim, sgdRec.Spec.ID))
		c.addRuntime(t, "rt-4")
	})
	both(24)
	if sgd.inStep != nil || adam.inStep != nil {
		t.Fatal("a fault was not injected")
	}
	for _, tr := range []*trainer{sgd, adam} {
		if tr.roundedP == 0 {
			t.Fatal("the reference's parameters were bf16 already at every step: the test rounds nothing")
		}
	}

	_, js := testutil.Connect(t, c.url)
	streams := map[*trainer]jetstream.Stream{}
	for tr, rec := range jobs {
		ps, err := js.Stream(context.Background(), wire.ParamsStream(rec.Spec.ID))
		if err != nil {
			t.Fatal(err)
		}
		streams[tr] = ps
		// The stored parameters, what a worker that restarts reads: the workers' bf16 copy.
		if got := testutil.ParamsAt(t, ps, rec, tr.step); !bytes.Equal(f32bytes(got), f32bytes(tr.want)) {
			t.Fatalf("%s: the stored parameters of step %d are not the reference's rounded to bf16", rec.Spec.ID, tr.step)
		}
		checkF32Checkpoints(t, ps, rec, tr, false)
	}
	// Stopped gracefully, the runtimes checkpoint what they applied: every shard's checkpoint is
	// then the reference's f32 parameters after the last step, bit for bit.
	var ids []string
	for id := range c.runtimes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c.runtimes[id].stop(syscall.SIGTERM)
	}
	for tr, rec := range jobs {
		checkF32Checkpoints(t, streams[tr], rec, tr, true)
	}
	t.Logf("trained sgd (bf16 gradients) and adam (f32 gradients) with bf16 parameters %d steps bit-exact across: %v", sgd.step, faults)
}

// checkF32Checkpoints checks every shard's newest checkpoint: f32, (1+slots) vectors long, its
// parameters the reference's f32 parameters of its step, bit for bit. With last, it must be of the
// trainer's last step (waiting a while for it); otherwise of any step trained.
func checkF32Checkpoints(t *testing.T, ps jetstream.Stream, rec *job.Record, tr *trainer, last bool) {
	t.Helper()
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rec.Layout.Shards {
		testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			m, err := ps.GetLastMsgForSubject(context.Background(), wire.CkptSubject(rec.Spec.ID, s.ID))
			if err != nil {
				return fmt.Errorf("%s shard %d: no checkpoint: %w", rec.Spec.ID, s.ID, err)
			}
			step, err := wire.ParseStep(m.Header)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case step < 0 || step > tr.step:
				t.Fatalf("%s shard %d: checkpoint of step %d, the workers are at step %d", rec.Spec.ID, s.ID, step, tr.step)
			case last && step != tr.step:
				return fmt.Errorf("%s shard %d: checkpoint of step %d, want the last, %d", rec.Spec.ID, s.ID, step, tr.step)
			case m.Header.Get(wire.HdrDtype) != wire.DtypeF32:
				t.Fatalf("%s shard %d: checkpoint of step %d is %q, not f32", rec.Spec.ID, s.ID, step, m.Header.Get(wire.HdrDtype))
			case len(m.Data) != (1+fn.Slots())*s.Bytes():
				t.Fatalf("%s shard %d: checkpoint of %d bytes, want %d", rec.Spec.ID, s.ID, len(m.Data), (1+fn.Slots())*s.Bytes())
			case !bytes.Equal(m.Data[:s.Bytes()], f32bytes(tr.hist[step][s.Off:s.Off+s.Len])):
				t.Fatalf("%s shard %d: the checkpoint of step %d is not the reference's f32 parameters", rec.Spec.ID, s.ID, step)
			}
			return nil
		})
	}
}

// busiest is the live runtime of c that owns the most shards of rec (placement bucket).
func busiest(t *testing.T, c *cluster, rec *job.Record) string {
	t.Helper()
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, wire.PlacementBucket)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, s := range rec.Layout.Shards {
		e, err := kv.Get(ctx, wire.PlacementKey(rec.Spec.ID, s.ID))
		if err != nil {
			t.Fatalf("placement of %s shard %d: %v", rec.Spec.ID, s.ID, err)
		}
		var p wire.Placement
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			t.Fatal(err)
		}
		if _, live := c.runtimes[p.Runtime]; live {
			count[p.Runtime]++
		}
	}
	best := ""
	for id, n := range count {
		if best == "" || n > count[best] || n == count[best] && id < best {
			best = id
		}
	}
	if best == "" {
		t.Fatalf("no live runtime owns a shard of %s: %v", rec.Spec.ID, count)
	}
	return best
}
