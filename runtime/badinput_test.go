package runtime_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestBadInputRejected sends each class of malformed gradient between good steps. Each is refused
// with its specific reason, reported to the sender's Fanin-Reply-To, counted, and the job's
// parameters still equal the reference byte for byte.
func TestBadInputRejected(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx := context.Background()
	rec, err := st.Gateway.CreateJob(ctx, testSpec("bad", "sgd", map[string]float64{"lr": 0.1}))
	if err != nil {
		t.Fatal(err)
	}
	nc, js := testutil.Connect(t, st.URL)
	ps, _ := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
	inbox := wire.InboxPrefix(rec.Spec.ID) + ".reports" // rejections are sent only inside the job's reply namespace
	reports, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}

	shard := rec.Layout.Shards[1]
	good := func(step int64, rank int, data []byte) *nats.Msg {
		m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, shard.ID))
		m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
		m.Header.Set(wire.HdrRank, strconv.Itoa(rank))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Header.Set(wire.HdrReplyTo, inbox)
		m.Data = data
		return m
	}
	zeros := make([]byte, shard.Bytes())
	withNaN := bytes.Clone(zeros)
	binary.LittleEndian.PutUint32(withNaN[40:], math.Float32bits(float32(math.NaN())))

	// Train two good steps so that "stale" has something to be stale against.
	params := testutil.ParamsAt(t, ps, rec, 0)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 4, rec.Layout.Ranges(), params)
	grads := make([][]float32, 4)
	for r := range grads {
		grads[r] = make([]float32, rec.Layout.Elements)
	}
	goodStep := func(step int64, skipShard1Rank0 bool) {
		for r := range 4 {
			testutil.Gradient(grads[r], params, step, r)
			for _, s := range rec.Layout.Shards {
				if skipShard1Rank0 && s.ID == shard.ID && r == 0 {
					continue
				}
				m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, s.ID))
				m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
				m.Header.Set(wire.HdrRank, strconv.Itoa(r))
				m.Header.Set(wire.HdrDtype, wire.DtypeF32)
				m.Data = f32bytes(grads[r][s.Off : s.Off+s.Len])
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for step := int64(1); step <= 2; step++ {
		goodStep(step, false)
		ref.Step(grads, nil)
		params = testutil.ParamsAt(t, ps, rec, step)
	}
	// Step 3 is open on shard 1: every rank but rank 0 has sent it.
	goodStep(3, true)

	cases := []struct {
		name string
		msg  func() *nats.Msg
		want wire.Reason
	}{
		{"short payload", func() *nats.Msg { return good(3, 0, zeros[:100]) }, wire.ReasonBadLength},
		{"not whole floats", func() *nats.Msg { return good(3, 0, zeros[:len(zeros)-1]) }, wire.ReasonBadLength},
		{"oversized payload", func() *nats.Msg { return good(3, 0, make([]byte, shard.Bytes()+4)) }, wire.ReasonOversized},
		{"rank out of range", func() *nats.Msg { return good(3, 4, zeros) }, wire.ReasonRankRange},
		{"stale step", func() *nats.Msg { return good(2, 0, zeros) }, wire.ReasonStaleStep},
		{"future step", func() *nats.Msg { return good(5, 0, zeros) }, wire.ReasonFutureStep},
		{"duplicate rank", func() *nats.Msg { return good(3, 1, zeros) }, wire.ReasonDuplicate},
		{"NaN", func() *nats.Msg { return good(3, 0, withNaN) }, wire.ReasonNonFinite},
		{"missing step", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Del(wire.HdrStep); return m }, wire.ReasonMissingHeader},
		{"missing rank", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Del(wire.HdrRank); return m }, wire.ReasonMissingHeader},
		{"missing dtype", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Del(wire.HdrDtype); return m }, wire.ReasonMissingHeader},
		{"bad step", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Set(wire.HdrStep, "-3"); return m }, wire.ReasonBadHeader},
		// The rank parses though the step does not: the report names rank 1, and no step (the
		// value past int64 is quoted as sent, not clamped).
		{"step 2^64+1 of rank 1", func() *nats.Msg {
			m := good(3, 1, zeros)
			m.Header.Set(wire.HdrStep, "18446744073709551617")
			return m
		}, wire.ReasonBadHeader},
		{"bad step of rank 2", func() *nats.Msg { m := good(3, 2, zeros); m.Header.Set(wire.HdrStep, "x"); return m }, wire.ReasonBadHeader},
		{"bad rank at step 3", func() *nats.Msg { m := good(3, 1, zeros); m.Header.Set(wire.HdrRank, "one"); return m }, wire.ReasonBadHeader},
		{"bad dtype", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Set(wire.HdrDtype, "f64"); return m }, wire.ReasonBadDtype},
		{"f16 of f32 length", func() *nats.Msg { m := good(3, 0, zeros); m.Header.Set(wire.HdrDtype, "f16"); return m }, wire.ReasonOversized},
		{"bf16 short", func() *nats.Msg {
			m := good(3, 0, zeros[:2*shard.Len-2])
			m.Header.Set(wire.HdrDtype, wire.DtypeBF16)
			return m
		}, wire.ReasonBadLength},
		{"bf16 NaN", func() *nats.Msg {
			b := make([]byte, 2*shard.Len)
			binary.LittleEndian.PutUint16(b[6:], 0xffc1)
			m := good(3, 0, b)
			m.Header.Set(wire.HdrDtype, wire.DtypeBF16)
			return m
		}, wire.ReasonNonFinite},
		{"f16 Inf", func() *nats.Msg {
			b := make([]byte, 2*shard.Len)
			binary.LittleEndian.PutUint16(b[2*shard.Len-2:], 0x7c00)
			m := good(3, 0, b)
			m.Header.Set(wire.HdrDtype, wire.DtypeF16)
			return m
		}, wire.ReasonNonFinite},
		{"unknown shard", func() *nats.Msg {
			m := good(3, 0, zeros)
			m.Subject = wire.GradSubject(rec.Spec.ID, 99)
			return m
		}, wire.ReasonUnknownShard},
	}
	rejectsBefore := map[wire.Reason]int64{}
	count := func() map[wire.Reason]int64 {
		sum := map[wire.Reason]int64{}
		for _, rt := range st.AllRuntimes() {
			for k, v := range rt.Stats().Rejects {
				sum[k] += v
			}
		}
		return sum
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rejectsBefore = count()
			if _, err := js.PublishMsg(ctx, c.msg()); err != nil {
				t.Fatalf("publish: %v", err)
			}
			m, err := reports.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no rejection report: %v", err)
			}
			rej, err := wire.UnmarshalReject(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if rej.Reason != c.want || m.Header.Get(wire.HdrReject) != string(c.want) {
				t.Fatalf("reason %q (%s), want %q", rej.Reason, rej.Detail, c.want)
			}
			if want := map[string]string{
				"bf16 short":        fmt.Sprintf("shard %d holds %d bf16 elements (%d bytes)", shard.ID, shard.Len, 2*shard.Len),
				"f16 of f32 length": fmt.Sprintf("payload is %d bytes, shard %d holds %d f16 elements (%d bytes)", shard.Bytes(), shard.ID, shard.Len, 2*shard.Len),
			}[c.name]; !strings.Contains(rej.Detail, want) {
				t.Fatalf("detail %q, want it to say %q", rej.Detail, want)
			}
			// The rank and step the report names (rank -1, step 0: none).
			if want, ok := map[string][2]int64{
				"step 2^64+1 of rank 1": {1, 0}, "bad step of rank 2": {2, 0}, "bad rank at step 3": {-1, 3},
			}[c.name]; ok && (int64(rej.Rank) != want[0] || rej.Step != want[1]) {
				t.Fatalf("report names rank %d step %d, want rank %d step %d: %+v", rej.Rank, rej.Step, want[0], want[1], rej)
			}
			if c.name == "step 2^64+1 of rank 1" && !strings.Contains(rej.Detail, `"18446744073709551617"`) {
				t.Fatalf("detail %q does not quote the step as sent", rej.Detail)
			}
			if rej.Job != rec.Spec.ID || rej.Detail == "" {
				t.Fatalf("report lacks job or detail: %+v", rej)
			}
			testutil.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
				if got := count()[c.want]; got != rejectsBefore[c.want]+1 {
					return fmt.Errorf("%s counted %d times, want %d", c.want, got, rejectsBefore[c.want]+1)
				}
				return nil
			})
		})
	}

	t.Run("unknown job", func(t *testing.T) {
		m := good(1, 0, zeros)
		m.Subject = wire.GradSubject("no-such-job", 0)
		_, err := js.PublishMsg(ctx, m)
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("publish to an unknown job: %v, want no stream response", err)
		}
	})
	t.Run("over max_payload", func(t *testing.T) {
		m := good(3, 0, make([]byte, embed.MaxPayload+1))
		_, err := js.PublishMsg(ctx, m)
		if !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publish over max_payload: %v, want %v", err, nats.ErrMaxPayload)
		}
	})

	// The open step completes with the real rank-0 gradient; the result is the reference's.
	m := good(3, 0, f32bytes(grads[0][shard.Off:shard.Off+shard.Len]))
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	ref.Step(grads, nil)
	params = testutil.ParamsAt(t, ps, rec, 3)
	if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
		t.Fatal("after the bad inputs, parameters differ from the reference")
	}
	if _, err := reports.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatal("a good gradient was reported as rejected")
	}
}
