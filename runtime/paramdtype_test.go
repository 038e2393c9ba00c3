package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/wire"
)

// TestBF16ParamsBitExact trains jobs with param_dtype bf16 (sgd: stateless; adam: stateful; in
// bsp, ssp driven in lockstep, and asp), each gradient computed, as a worker would, from the parameters as published:
// step 0 in f32, then the bf16 copy. Every parameters message, pushed or stored, is f32 at step 0
// and after it bf16 with the reference's f32 parameters rounded to nearest even, bit for bit;
// every checkpoint holds the reference's f32 parameters. Meanwhile the shards migrate twice
// (graceful handovers, in the middle of a step) and their runtime crashes (its connection cut:
// no final checkpoint, no handover) and restarts in the middle of a step: the f32 master
// parameters go on exactly, so no gradient was lost or applied twice.
func TestBF16ParamsBitExact(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"bsp", "ssp", "asp"} {
		for _, fn := range []string{"sgd", "adam"} {
			t.Run(mode+"/"+fn, func(t *testing.T) { t.Parallel(); testBF16Params(t, mode, fn) }) // a stack each
		}
	}
}

func testBF16Params(t *testing.T, mode, fn string) {
	staleness := 0
	if mode == "ssp" {
		staleness = 1
	}
	x := newBF16Run(t, job.Spec{
		ID: "p16-" + mode + "-" + fn, Ranks: 2, Sync: mode, Staleness: staleness, ParamDtype: wire.DtypeBF16,
		Tensors:  []job.Tensor{{Name: "w", Shape: []int{40, 50}}, {Name: "b", Shape: []int{700}}},
		Function: job.Function{Name: fn, Hyper: map[string]float64{"lr": 0.05}},
		Init:     job.Init{Kind: "normal", Seed: 11, Scale: 0.3}, ShardSize: 4 << 10,
	})
	if n := x.rec.Layout.NumShards(); n < 2 {
		t.Fatalf("layout has %d shards, the test wants several", n)
	}
	x.placeAll("rt-0")
	x.await(0)
	const steps = 10
	for step := int64(1); step <= steps; step++ {
		// Rank 0's gradients of the step are stored when the shards move or their runtime
		// crashes: the next owner finds them in the stream (or, after a handover, in the
		// checkpoint it wrote).
		x.rank(step, 0)
		switch step {
		case 3:
			x.placeAll("rt-1")
		case 5:
			x.crashable = startRuntime(t, x.st.URL, "rt-c")
			x.placeAll("rt-c")
		case 8:
			x.crashable.crash()
			x.crashable = startRuntime(t, x.st.URL, "rt-c")
		}
		x.rank(step, 1)
		if mode != "asp" {
			x.ref.Step(x.grads, nil)
			x.version++
			x.record()
		}
		x.await(x.version)
		x.checkCheckpoints()
	}
	x.checkPushed()
}

// bf16Run drives one bf16-param job on a stack without an autoscaler (placement by the test).
type bf16Run struct {
	t         *testing.T
	ctx       context.Context
	st        *devstack.Stack
	js        jetstream.JetStream
	pl        placer
	rec       *job.Record
	ps        jetstream.Stream
	ref       *functions.Reference
	slots     int
	grads     [][]float32         // the step's gradient of every rank (bsp)
	view      []float32           // the workers' copy: the parameters as published, decoded
	version   int64               // the shards' step (bsp) or update count (asp), the same for all
	hist      map[int64][]float32 // the reference's f32 parameters after each version
	crashable *crashableRuntime

	mu     sync.Mutex // guards pushed
	pushed []*nats.Msg
}

func newBF16Run(t *testing.T, spec job.Spec) *bf16Run {
	st, js, pl := placeableStack(t)
	ctx := context.Background()
	x := &bf16Run{t: t, ctx: ctx, st: st, js: js, pl: pl, hist: map[int64][]float32{}}
	// Every parameters message pushed, step 0 included: subscribed before the job exists.
	nc := js.Conn()
	sub, err := nc.Subscribe(wire.ParamsWildcard(spec.ID), func(m *nats.Msg) {
		x.mu.Lock()
		x.pushed = append(x.pushed, m)
		x.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil { // the server has the subscription before step 0 is published
		t.Fatal(err)
	}
	if x.rec, err = st.Gateway.CreateJob(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if x.ps, err = js.Stream(ctx, wire.ParamsStream(spec.ID)); err != nil {
		t.Fatal(err)
	}
	x.ref = testutil.Reference(t, x.rec)
	f, _ := x.rec.Spec.NewFunc()
	x.slots = f.Slots()
	x.view = slices.Clone(x.ref.Params())
	x.record()
	x.grads = make([][]float32, spec.Ranks)
	for r := range x.grads {
		x.grads[r] = make([]float32, x.rec.Layout.Elements)
	}
	return x
}

// record keeps the reference's parameters as those of the current version.
func (x *bf16Run) record() { x.hist[x.version] = slices.Clone(x.ref.Params()) }

// placeAll moves every shard to rt and waits until no other runtime serves any of them.
func (x *bf16Run) placeAll(rt string) {
	x.t.Helper()
	for _, s := range x.rec.Layout.Shards {
		x.pl.place(x.t, wire.PlacementKey(x.rec.Spec.ID, s.ID), rt)
	}
	testutil.CheckFor(x.t, 20*time.Second, 5*time.Millisecond, func() error {
		for _, r := range x.st.AllRuntimes() {
			for _, s := range x.rec.Layout.Shards {
				if key := wire.PlacementKey(x.rec.Spec.ID, s.ID); r.ID() != rt && slices.Contains(r.Shards(), key) {
					return fmt.Errorf("%s still serves %s", r.ID(), key)
				}
			}
		}
		return nil
	})
}

// rank publishes rank's gradient of step to every shard, computed from the workers' copy. In asp
// it is one update of every shard, applied before rank returns (the reference follows).
func (x *bf16Run) rank(step int64, rank int) {
	x.t.Helper()
	g := x.grads[rank]
	testutil.Gradient(g, x.view, step, rank)
	for _, s := range x.rec.Layout.Shards {
		// ssp: step-1, every gradient from the newest parameters
		m := wire.GradMsg(wire.Grad{Job: x.rec.Spec.ID, Shard: s.ID, Step: step, Rank: rank,
			Version: x.version, Versioned: x.rec.Spec.Sync != "bsp"}, f32bytes(g[s.Off:s.Off+s.Len]))
		if _, err := x.js.PublishMsg(x.ctx, m); err != nil {
			x.t.Fatal(err)
		}
	}
	if x.rec.Spec.Sync == "asp" {
		for i := range x.rec.Layout.Shards {
			x.ref.ApplyRank(i, g, 1)
		}
		x.version++
		x.record()
		x.await(x.version)
	}
}

// await waits until every shard's stored parameters are at version v, checks them against the
// reference, and takes them as the workers' copy.
func (x *bf16Run) await(v int64) {
	x.t.Helper()
	for _, s := range x.rec.Layout.Shards {
		testutil.CheckFor(x.t, 20*time.Second, 2*time.Millisecond, func() error {
			m, err := x.ps.GetLastMsgForSubject(x.ctx, wire.ParamsSubject(x.rec.Spec.ID, s.ID))
			if err != nil {
				return err
			}
			if got, err := wire.ParseStep(m.Header); err != nil || got != v {
				return fmt.Errorf("shard %d at step %d (%v), want %d", s.ID, got, err, v)
			}
			return nil
		})
		m, err := x.ps.GetLastMsgForSubject(x.ctx, wire.ParamsSubject(x.rec.Spec.ID, s.ID))
		if err != nil {
			x.t.Fatal(err)
		}
		if err := x.checkParams(s, m.Header, m.Data); err != nil {
			x.t.Fatalf("stored: %v", err)
		}
		if _, err := wire.DecodeParams(x.view[s.Off:s.Off+s.Len], m.Header, m.Data); err != nil {
			x.t.Fatal(err)
		}
	}
}

// checkParams compares a parameters message of shard s with the reference at its step: f32 at
// step 0, after it bf16, byte for byte and decoded (exactly, h << 16) as wire.Round gives it.
func (x *bf16Run) checkParams(s job.Shard, h nats.Header, data []byte) error {
	step, err := wire.ParseStep(h)
	if err != nil {
		return fmt.Errorf("shard %d: %v", s.ID, err)
	}
	master, ok := x.hist[step]
	if !ok {
		return fmt.Errorf("shard %d: parameters of step %d, which the reference has not reached", s.ID, step)
	}
	dt, want := testutil.ParamsPayload(x.rec, s, step, master)
	if got := h.Get(wire.HdrDtype); got != dt.String() {
		return fmt.Errorf("shard %d step %d: %s %q, want %s", s.ID, step, wire.HdrDtype, got, dt)
	}
	if x.rec.Spec.ParamsDtype() == wire.BF16 && (step == 0) != (dt == wire.F32) {
		return fmt.Errorf("shard %d step %d is %s: only step 0 is f32 in a bf16 job", s.ID, step, dt)
	}
	if !bytes.Equal(data, want) {
		return fmt.Errorf("shard %d step %d: the %s payload differs from the reference's", s.ID, step, dt)
	}
	if step > 0 {
		if err := x.checkSyncHeaders(h); err != nil {
			return fmt.Errorf("shard %d step %d: %v", s.ID, step, err)
		}
	}
	got, rounded := make([]float32, s.Len), make([]float32, s.Len)
	if _, err := wire.DecodeParams(got, h, data); err != nil {
		return fmt.Errorf("shard %d step %d: %v", s.ID, step, err)
	}
	wire.Round(rounded, master[s.Off:s.Off+s.Len], dt)
	if !bytes.Equal(f32bytes(got), f32bytes(rounded)) {
		return fmt.Errorf("shard %d step %d: decoded, the parameters are not wire.Round of the reference's", s.ID, step)
	}
	return nil
}

// checkSyncHeaders: a snapshot or parameters message of an ssp or asp job carries what its sync
// mode adds (docs/PROTOCOL.md, section 7), whatever its dtype.
func (x *bf16Run) checkSyncHeaders(h nats.Header) error {
	var need []string
	switch x.rec.Spec.Sync {
	case "ssp":
		need = []string{wire.HdrReplayFrom, wire.HdrStepSeqs}
	case "asp":
		need = []string{wire.HdrRankSteps, wire.HdrApplied}
	}
	for _, k := range need {
		if h.Get(k) == "" {
			return fmt.Errorf("no %s header", k)
		}
	}
	return nil
}

// checkCheckpoints: every shard has a checkpoint, f32, holding the reference's parameters at its
// step (optimizer state after them: adam's two vectors), at most ckptEvery steps behind.
func (x *bf16Run) checkCheckpoints() {
	x.t.Helper()
	for _, s := range x.rec.Layout.Shards {
		m, err := x.ps.GetLastMsgForSubject(x.ctx, wire.CkptSubject(x.rec.Spec.ID, s.ID))
		if err != nil {
			x.t.Fatalf("shard %d at step %d has no checkpoint: %v", s.ID, x.version, err)
		}
		step, err := wire.ParseStep(m.Header)
		if err != nil {
			x.t.Fatal(err)
		}
		master, ok := x.hist[step]
		switch {
		case !ok || step > x.version:
			x.t.Fatalf("shard %d: checkpoint of step %d, the reference is at %d", s.ID, step, x.version)
		case m.Header.Get(wire.HdrDtype) != wire.DtypeF32:
			x.t.Fatalf("shard %d: checkpoint %s %q, want f32", s.ID, wire.HdrDtype, m.Header.Get(wire.HdrDtype))
		case len(m.Data) != (1+x.slots)*s.Bytes():
			x.t.Fatalf("shard %d: checkpoint of %d bytes, want %d", s.ID, len(m.Data), (1+x.slots)*s.Bytes())
		case !bytes.Equal(m.Data[:s.Bytes()], f32bytes(master[s.Off:s.Off+s.Len])):
			x.t.Fatalf("shard %d: the checkpoint of step %d is not the reference's f32 parameters", s.ID, step)
		case x.version-step > 3+int64(max(1, (1+x.slots)/x.rec.Spec.Ranks)): // ckptEvery, and a few in flight
			x.t.Fatalf("shard %d: checkpoint of step %d at step %d", s.ID, step, x.version)
		}
		if step > 0 {
			if err := x.checkSyncHeaders(m.Header); err != nil {
				x.t.Fatalf("shard %d: checkpoint of step %d: %v", s.ID, step, err)
			}
		}
	}
}

// checkPushed checks every parameters message pushed to the workers, replays after the crash
// included.
func (x *bf16Run) checkPushed() {
	x.t.Helper()
	byID := map[int]job.Shard{}
	for _, s := range x.rec.Layout.Shards {
		byID[s.ID] = s
	}
	type key struct {
		shard int
		step  int64
	}
	// Every shard's every step was pushed at least once (a push may trail the stored copy).
	testutil.CheckFor(x.t, 10*time.Second, 5*time.Millisecond, func() error {
		x.mu.Lock()
		defer x.mu.Unlock()
		seen := map[key]bool{}
		for _, m := range x.pushed {
			id, _ := wire.ShardFromSubject(m.Subject)
			step, _ := wire.ParseStep(m.Header)
			seen[key{id, step}] = true
		}
		for v := range x.version + 1 {
			for id := range byID {
				if !seen[key{id, v}] {
					return fmt.Errorf("the parameters of shard %d at step %d were not pushed", id, v)
				}
			}
		}
		return nil
	})
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, m := range x.pushed {
		id, ok := wire.ShardFromSubject(m.Subject)
		if _, known := byID[id]; !ok || !known {
			x.t.Fatalf("pushed on %s", m.Subject)
		}
		if err := x.checkParams(byID[id], m.Header, m.Data); err != nil {
			x.t.Fatalf("pushed: %v", err)
		}
	}
}

// crashableRuntime is a runtime on a connection of its own, which crash cuts: it stops without
// a final checkpoint or a handover record, as after a SIGKILL.
type crashableRuntime struct {
	rt   *runtime.Runtime
	nc   *nats.Conn
	stop context.CancelFunc
	done chan struct{}
}

// startRuntime starts a runtime with the given id, stopped (if not crashed) when the test ends.
func startRuntime(t *testing.T, url, id string) *crashableRuntime {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("fanin-runtime-"+id))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.New(nc, runtime.WithID(id), runtime.WithLogger(testutil.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &crashableRuntime{rt: rt, nc: nc, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		_ = rt.Run(ctx)
	}()
	t.Cleanup(func() { c.stop(); <-c.done; c.nc.Close() })
	return c
}

func (c *crashableRuntime) crash() {
	c.nc.Close()
	c.stop()
	<-c.done
}

// TestUploadedStepZeroIsCheckpointed: a shard that checkpoints (adam; sgd with bf16 parameters)
// writes its first checkpoint as soon as it adopts an uploaded step 0, as it does from a step 0
// computed at creation: otherwise a runtime that crashed before the next checkpoint (adam with
// one rank checkpoints every 3 steps) left parameters newer than step 0 and no checkpoint, and
// the shard could never be restored.
func TestUploadedStepZeroIsCheckpointed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ fn, dtype string }{{"adam", wire.DtypeF32}, {"sgd", wire.DtypeBF16}} {
		t.Run(c.fn+"-"+c.dtype, func(t *testing.T) {
			t.Parallel() // a stack each
			x := newBF16Run(t, job.Spec{
				ID: "up-" + c.fn + "-" + c.dtype, Ranks: 1, ParamDtype: c.dtype,
				Tensors:  []job.Tensor{{Name: "w", Shape: []int{1500}}},
				Function: job.Function{Name: c.fn, Hyper: map[string]float64{"lr": 0.05}},
				Init:     job.Init{Kind: "upload"}, ShardSize: 4 << 10,
			})
			upload := make([]float32, x.rec.Layout.Elements)
			testutil.Gradient(upload, upload, 99, 0)
			f, _ := x.rec.Spec.NewFunc()
			x.ref = functions.NewReference(f, 1, x.rec.Layout.Ranges(), upload)
			x.record()
			x.crashable = startRuntime(t, x.st.URL, "rt-c")
			x.placeAll("rt-c")
			for _, s := range x.rec.Layout.Shards {
				m := wire.InitMsg(x.rec.Spec.ID, s.ID, f32bytes(upload[s.Off:s.Off+s.Len]))
				if _, err := x.js.PublishMsg(x.ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			x.await(0)
			testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
				for _, s := range x.rec.Layout.Shards {
					if _, err := x.ps.GetLastMsgForSubject(x.ctx, wire.CkptSubject(x.rec.Spec.ID, s.ID)); err != nil {
						return fmt.Errorf("shard %d adopted its upload but has no checkpoint: %v", s.ID, err)
					}
				}
				return nil
			})
			x.checkCheckpoints()
			for step := int64(1); step <= 4; step++ {
				if step == 3 {
					x.crashable.crash()
					x.crashable = startRuntime(t, x.st.URL, "rt-c")
				}
				x.rank(step, 0)
				x.ref.Step(x.grads, nil)
				x.version++
				x.record()
				x.await(x.version)
				x.checkCheckpoints()
			}
			x.checkPushed()
		})
	}
}
