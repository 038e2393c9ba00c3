package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// raceEnabled is set under the race detector (race_test.go), which slows every step tenfold.
var raceEnabled bool

// stressSteps is how many steps TestFastSteppingLosesNothing takes: FANIN_STRESS_STEPS, or a
// shortened run for CI (shorter still under the race detector).
func stressSteps(t *testing.T) int64 {
	if s := os.Getenv("FANIN_STRESS_STEPS"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			t.Fatalf("FANIN_STRESS_STEPS=%q: want a positive number of steps", s)
		}
		return n
	}
	if testing.Short() || raceEnabled {
		return 500
	}
	return 3000
}

// burnCPU keeps every core busy with other processes (shell busy loops), as on a loaded node, until
// the test ends. A test that burns does not run in parallel: the load is for it alone to run under.
func burnCPU(t *testing.T) {
	t.Helper()
	for range 2 * goruntime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a CPU burner: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// TestFastSteppingLosesNothing steps a 1-rank bsp sum job as fast as one worker can (publish step
// t, wait for step t's parameters) while other processes keep the cores busy: no acknowledged
// gradient may be lost, so no step may stall, and every step's parameters are the reference's.
// A stall fails at once with the stream's and the consumer's state. Run in full with
// FANIN_STRESS_STEPS=100000 go test -run TestFastSteppingLosesNothing -timeout 60m ./runtime/
func TestFastSteppingLosesNothing(t *testing.T) {
	t.Run("load", func(t *testing.T) { fastStepping(t, stressSteps(t), 0, false) })
	// The server cuts the runtime's connection now and then, as it cuts a slow consumer: whatever
	// it was sending is lost, the tail of the shard's gradients included.
	t.Run("cuts", func(t *testing.T) { fastStepping(t, 0, 6, false) })
	// The cuts come while the gradient stream is full: the worker waits for room, the runtime
	// has applied every gradient the stream holds, and the purge that would make room is in
	// flight (or about to be) when the connection goes.
	t.Run("cuts-when-full", func(t *testing.T) { fastStepping(t, 0, 6, true) })
}

// fastStepping steps the job until steps steps and cuts cuts of the runtime's connection are done;
// with whenFull, each cut waits until the job's gradient stream is full.
func fastStepping(t *testing.T, steps int64, cuts int, whenFull bool) {
	st := testutil.Stack(t, 1)
	burnCPU(t)
	ctx := context.Background()
	rec, err := st.Gateway.CreateJob(ctx, job.Spec{
		ID:        "fast",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{256}}},
		Ranks:     1,
		Function:  job.Function{Name: "sum"},
		Init:      job.Init{Kind: "normal", Seed: 3, Scale: 0.1},
		ShardSize: 4 << 10,
		Storage:   os.Getenv("FANIN_STRESS_STORAGE"),
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := c.Worker(ctx, rec.Spec.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, params, err := w.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ref := testutil.Reference(t, rec)
	g := make([]float32, len(params))
	start := time.Now()
	var done atomic.Int64 // steps completed, for the cutter
	var when func() bool
	if whenFull {
		when = streamFull(t, st.URL, rec)
	}
	cut := cutter(t, st.NATS, "fanin-runtime-", cuts, &done, when)
	step := int64(1)
	for ; step <= steps || cut.Load() < int64(cuts); step++ {
		done.Store(step - 1)
		testutil.Gradient(g, params, step, 0)
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		params, err = w.Step(sctx, g)
		cancel()
		if err != nil {
			t.Fatalf("step %d of %d: %v\n%s", step, steps, err, jobState(st.URL, rec))
		}
		ref.Step([][]float32{g}, nil)
		if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
			t.Fatalf("step %d: parameters differ from the reference's", step)
		}
	}
	t.Logf("%d steps, %d cuts of the runtime's connection in %v (%.0f steps/s) with %d CPU burners", step-1, cut.Load(), time.Since(start).Round(time.Millisecond),
		float64(step-1)/time.Since(start).Seconds(), 2*goruntime.NumCPU())
}

// jobState describes a job's gradient stream and its consumers, for a stall's report.
func jobState(url string, rec *job.Record) string {
	nc, err := nats.Connect(url)
	if err != nil {
		return "connect: " + err.Error()
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b bytes.Buffer
	// Who should serve the job: its shards' placement and the runtimes registered (a stall with no
	// consumer on the gradient stream is a shard that no runtime started).
	for _, bucket := range []string{wire.PlacementBucket, wire.RuntimesBucket} {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", bucket, err)
			continue
		}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", bucket, err)
			continue
		}
		for k := range keys.Keys() {
			if bucket == wire.PlacementBucket && !strings.HasPrefix(k, rec.Spec.ID+".") {
				continue
			}
			if e, err := kv.Get(ctx, k); err == nil {
				fmt.Fprintf(&b, "%s %s (rev %d, %s ago): %s\n", bucket, k, e.Revision(), time.Since(e.Created()).Round(time.Millisecond), e.Value())
			}
		}
	}
	s, err := js.Stream(ctx, wire.GradStream(rec.Spec.ID))
	if err != nil {
		return b.String() + "stream: " + err.Error()
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err == nil {
		j, _ := json.Marshal(info.State)
		fmt.Fprintf(&b, "gradient stream: %s\n", j)
	}
	for name := range s.ConsumerNames(ctx).Name() {
		cons, err := s.Consumer(ctx, name)
		if err != nil {
			continue
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "consumer %s: delivered %+v ack floor %+v pending %d waiting %d start %d\n",
			name, ci.Delivered, ci.AckFloor, ci.NumPending, ci.NumWaiting, ci.Config.OptStartSeq)
	}
	if info == nil {
		return b.String()
	}
	for seq := max(info.State.FirstSeq, info.State.LastSeq-min(info.State.LastSeq, 8)); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			fmt.Fprintf(&b, "msg %d: %v\n", seq, err)
			continue
		}
		fmt.Fprintf(&b, "msg %d %s step %s id %s\n", seq, m.Subject, m.Header.Get(wire.HdrStep), m.Header.Get(wire.HdrMsgID))
	}
	return b.String()
}

// cutter closes, from the server's side, the connections whose names start with prefix, 100 to
// 600 ms after the stepping has gone three steps past the previous cut (one cut per step at most:
// the reconnection takes seconds, and a step cut again and again would outlast its timeout
// without anything lost), until it has made cuts; it counts them. With when, each cut also waits
// (up to 5 s) until when reports true.
func cutter(t *testing.T, srv *server.Server, prefix string, cuts int, stepped *atomic.Int64, when func() bool) *atomic.Int64 {
	var n atomic.Int64
	if cuts == 0 {
		return &n
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		rng := rand.New(rand.NewPCG(1, 2))
		last := int64(-3)
		for n.Load() < int64(cuts) {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(100+rng.IntN(500)) * time.Millisecond):
			}
			if stepped.Load() < last+3 {
				continue
			}
			for wait := time.Now().Add(5 * time.Second); when != nil && !when() && time.Now().Before(wait); {
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
			}
			cz, err := srv.Connz(&server.ConnzOptions{})
			if err != nil {
				continue
			}
			for _, c := range cz.Conns {
				if strings.HasPrefix(c.Name, prefix) && srv.DisconnectClientByID(c.Cid) == nil {
					n.Add(1)
					last = stepped.Load()
				}
			}
		}
	}()
	return &n
}

// streamFull returns a check of whether rec's gradient stream holds as many messages as its bound.
func streamFull(t *testing.T, url string, rec *job.Record) func() bool {
	_, js := testutil.Connect(t, url)
	s, err := js.Stream(context.Background(), wire.GradStream(rec.Spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := s.Info(ctx)
		return err == nil && info.Config.MaxMsgs > 0 && int64(info.State.Msgs) >= info.Config.MaxMsgs
	}
}
