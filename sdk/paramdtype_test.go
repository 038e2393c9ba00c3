package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// rounded is v rounded to dt, as a worker receives parameters published in dt.
func rounded(v []float32, dt wire.Dtype) []float32 {
	out := make([]float32, len(v))
	wire.Round(out, v, dt)
	return out
}

// next is a parameter vector after p that no 16-bit dtype holds exactly (p + g + 1e-3).
func next(p []float32, step int64) []float32 {
	g := make([]float32, len(p))
	testutil.Gradient(g, p, step, 7)
	out := make([]float32, len(p))
	for i := range out {
		out[i] = p[i] + g[i] + 1e-3
	}
	return out
}

// A bsp worker takes parameters in the dtype of their message (Fanin-Dtype), pushed or fetched:
// f32 at step 0 exactly as before, then bf16 and f16 messages as exactly wire.BF16ToF32 and
// wire.F16ToF32 of their elements (wire.Round of what the "runtime" encoded). A worker that joins
// later reads the same from the stream, also where it has to read a shard's previous version.
func TestParamsInTheirDtype(t *testing.T) {
	t.Parallel()
	s := spec("pdt", "sum", 1)
	s.ParamDtype = wire.DtypeBF16
	f := newFakeJob(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, shards := f.rec.Spec.ID, f.rec.Layout.Shards
	p, c, w := f.startAtStepZero(ctx, sdk.WithFetchAfter(20*time.Millisecond))
	if _, got, err := w.Params(ctx); err != nil || !bytes.Equal(bits(got), bits(p)) {
		t.Fatalf("step 0 (f32): %v, equal: %v", err, err == nil && bytes.Equal(bits(got), bits(p)))
	}
	g := make([]float32, len(p))
	for step, dt := range []wire.Dtype{wire.BF16, wire.F16, wire.F32, wire.BF16} {
		t0 := int64(step + 1)
		want := next(p, t0)
		done := make(chan error, 1)
		var got []float32
		go func() {
			var err error
			got, err = w.Step(ctx, g)
			done <- err
		}()
		f.waitGrads(ctx, t0) // the worker waits for step t0: a push it takes
		f.publishAll(t0, dt, want)
		if err := <-done; err != nil {
			t.Fatalf("step %d (%s): %v", t0, dt, err)
		}
		if !bytes.Equal(bits(got), bits(rounded(want, dt))) {
			t.Fatalf("step %d: the parameters are not exactly the %s message's", t0, dt)
		}
		if dt != wire.F32 && bytes.Equal(bits(got), bits(want)) {
			t.Fatalf("step %d: %s parameters equal their f32 values: the test rounds nothing", t0, dt)
		}
		p = rounded(want, dt)
	}

	// A late worker reads the stream: shard 0 one step ahead (f16), the others at the last step
	// (bf16): Params returns that step, shard 0 from its previous version.
	ahead := next(p, 9)
	f.publishParams(0, 5, wire.F16, ahead[shards[0].Off:shards[0].Off+shards[0].Len], nil)
	late, err := c.Worker(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if step, got, err := late.Params(ctx); err != nil || step != 4 || !bytes.Equal(bits(got), bits(p)) {
		t.Fatalf("a late worker's Params: step %d, %v, equal: %v", step, err, err == nil && bytes.Equal(bits(got), bits(p)))
	}
}

// Parameters messages the worker cannot read (a Fanin-Dtype it does not know, a payload that is
// not the shard in its dtype) are never taken: pushed, they are ignored and the worker fetches the
// shard from the stream, where the same message fails the Step naming the shard and what is
// wrong; the parameters held stay those of the step before, and Params fails the same way.
func TestParamsUnreadableAreRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, dtype string
		bytes       func(n int) int
		reason      string
	}{
		{"unknown dtype", "f8", func(n int) int { return n }, `Fanin-Dtype "f8"`},
		{"bf16 of f32 length", wire.DtypeBF16, func(n int) int { return 4 * n }, "bytes, want"},
		{"bf16 one element short", wire.DtypeBF16, func(n int) int { return 2*n - 2 }, "bytes, want"},
		{"f32 odd length", wire.DtypeF32, func(n int) int { return 4*n + 1 }, "bytes, want"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, sync := range []string{"bsp", "ssp"} {
				t.Run(sync, func(t *testing.T) { paramsUnreadable(t, sync, c.dtype, c.bytes, c.reason) })
			}
		})
	}
}

func paramsUnreadable(t *testing.T, sync, dtype string, size func(int) int, reason string) {
	s := spec("bad", "sum", 1)
	s.Sync = sync
	if sync == "ssp" {
		s.Staleness = 1
	}
	f := newFakeJob(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, shards := f.rec.Spec.ID, f.rec.Layout.Shards
	p, _, w := f.startAtStepZero(ctx, sdk.WithFetchAfter(20*time.Millisecond))
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, len(p))
	if sync == "ssp" { // step 1 is within the bound of step 0's parameters: it does not wait
		if _, err := w.Step(ctx, g); err != nil {
			t.Fatal(err)
		}
		f.waitGrads(ctx, 1)
	}
	// The step whose parameters the worker must have: 1 (bsp), 2 (ssp: version 1 or later).
	bad := shards[1]
	done := make(chan error, 1)
	go func() { _, err := w.Step(ctx, g); done <- err }()
	f.waitGrads(ctx, int64(map[string]int{"bsp": 1, "ssp": 2}[sync]))
	want := next(p, 1)
	for i, sh := range shards {
		if i == bad.ID {
			m := wire.ParamsMsg(id, "", sh.ID, 1, 1, make([]byte, size(sh.Len)))
			m.Header.Set(wire.HdrDtype, dtype)
			if _, err := f.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			continue
		}
		f.publishParams(i, 1, wire.BF16, want[sh.Off:sh.Off+sh.Len], nil)
	}
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "shard 1") || !strings.Contains(err.Error(), reason) {
		t.Fatalf("Step with shard 1's parameters unreadable: %v, want an error naming shard 1 and %q", err, reason)
	}
	t.Logf("%s", err)
	held := w.Versions()
	if held[bad.ID] != 0 {
		t.Fatalf("the unreadable parameters were taken: versions %v", held)
	}
	if _, _, err := w.Params(ctx); err == nil || !strings.Contains(err.Error(), reason) {
		t.Fatalf("Params with shard 1's parameters unreadable: %v", err)
	}
	if slices.Max(w.Versions()) > 1 || w.Versions()[bad.ID] != 0 {
		t.Fatalf("versions after the failed Params: %v", w.Versions())
	}
}

// An ssp worker stages parameters pushed in bf16 (they wait beside the caller's vector until
// Step takes them) and takes them exactly as wire.BF16ToF32 of their elements.
func TestParamsInTheirDtypeSSP(t *testing.T) {
	t.Parallel()
	s := spec("pdt-ssp", "sum", 1)
	s.Sync, s.Staleness, s.ParamDtype = "ssp", 1, wire.DtypeBF16
	f := newFakeJob(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, _, w := f.startAtStepZero(ctx)
	g := make([]float32, len(p))
	got, err := w.Step(ctx, g) // step 1 needs version 0: the initial f32 parameters
	if err != nil || !bytes.Equal(bits(got), bits(p)) {
		t.Fatalf("step 1: %v, the initial parameters: %v", err, err == nil && bytes.Equal(bits(got), bits(p)))
	}
	want := next(p, 1)
	f.publishAll(1, wire.BF16, want)
	got, err = w.Step(ctx, g) // step 2 needs version 1: staged from the pushes, or fetched
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bits(got), bits(rounded(want, wire.BF16))) || slices.Min(w.Versions()) != 1 {
		t.Fatalf("step 2: versions %v, the bf16 parameters exactly: %v", w.Versions(), bytes.Equal(bits(got), bits(rounded(want, wire.BF16))))
	}
}

// End to end with fanin's runtimes: a param_dtype bf16 job trained by two workers, each gradient
// computed from the parameters the workers hold. They receive the initial parameters in f32 and,
// after every step, exactly the reference's f32 parameters rounded to bf16 (wire.Round); a worker
// that joins late reads the same.
func TestBF16JobEndToEnd(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := spec("p16", "adam", 2)
	s.Function.Hyper["lr"] = 0.01
	s.ParamDtype = wire.DtypeBF16
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws := make([]*sdk.Worker, 2)
	for r := range ws {
		if ws[r], err = c.Worker(ctx, rec.Spec.ID, r); err != nil {
			t.Fatal(err)
		}
		defer ws[r].Close()
	}
	ref := testutil.Reference(t, rec)
	_, params, err := ws[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bits(params), bits(ref.Params())) {
		t.Fatal("the initial parameters are not the reference's f32 ones")
	}
	params = slices.Clone(params)
	g := [][]float32{make([]float32, len(params)), make([]float32, len(params))}
	const steps = 5
	for step := int64(1); step <= steps; step++ {
		for r := range g {
			testutil.Gradient(g[r], params, step, r)
		}
		out := make([][]float32, 2)
		errs := make([]error, 2)
		done := make(chan struct{})
		for r, w := range ws {
			go func() { out[r], errs[r] = w.Step(ctx, g[r]); done <- struct{}{} }()
		}
		<-done
		<-done
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("step %d: %v, %v", step, errs[0], errs[1])
		}
		ref.Step(g, nil)
		want := rounded(ref.Params(), wire.BF16)
		for r := range out {
			if !bytes.Equal(bits(out[r]), bits(want)) {
				t.Fatalf("step %d: rank %d's parameters are not the reference's rounded to bf16", step, r)
			}
		}
		if bytes.Equal(bits(want), bits(ref.Params())) {
			t.Fatalf("step %d: the reference's parameters are bf16 already: the test rounds nothing", step)
		}
		params = append(params[:0], out[0]...)
	}
	late, err := c.Worker(ctx, rec.Spec.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	// The workers are pushed the parameters a moment before the stream holds every shard's: wait
	// for step 5 there.
	testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		step, got, err := late.Params(ctx)
		if err != nil || step != steps {
			return fmt.Errorf("a late worker's Params: step %d, %v", step, err)
		}
		if !bytes.Equal(bits(got), bits(params)) {
			t.Fatal("a late worker's parameters are not the bf16 ones the others hold")
		}
		return nil
	})
}
