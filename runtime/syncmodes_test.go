package runtime_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestSyncModeRejections sends an ssp job (s = 2) and an asp job the gradients their modes refuse,
// between good ones, and checks each report's reason and words.
func TestSyncModeRejections(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, js := testutil.Connect(t, st.URL)
	mk := func(id, mode string, s int) *job.Record {
		spec := job.Spec{ID: id, Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}},
			Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, Sync: mode, Staleness: s}
		rec, err := st.Gateway.CreateJob(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	type grad struct {
		step    int64
		rank    int
		version string // "" for none
	}
	var n int
	send := func(rec *job.Record, inbox string, g grad) {
		t.Helper()
		n++
		m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, 0))
		m.Header.Set(wire.HdrStep, strconv.FormatInt(g.step, 10))
		m.Header.Set(wire.HdrRank, strconv.Itoa(g.rank))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Header.Set(wire.HdrReplyTo, inbox)
		m.Header.Set(wire.HdrMsgID, "m"+strconv.Itoa(n)) // every one a new message
		if g.version != "" {
			m.Header.Set(wire.HdrVersion, g.version)
		}
		m.Data = make([]byte, rec.Layout.Shards[0].Bytes())
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(sub *nats.Subscription, reason wire.Reason, words string) {
		t.Helper()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no report (want %s %q): %v", reason, words, err)
		}
		rej, err := wire.UnmarshalReject(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if rej.Reason != reason || !strings.Contains(rej.Detail, words) {
			t.Fatalf("report %s %q, want %s containing %q", rej.Reason, rej.Detail, reason, words)
		}
	}
	quiet := func(sub *nats.Subscription) {
		t.Helper()
		if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("unexpected report %s", m.Data)
		}
	}
	params := func(rec *job.Record) int64 {
		t.Helper()
		var step int64
		testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			m, err := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
			if err != nil {
				return err
			}
			pm, err := m.GetLastMsgForSubject(ctx, wire.ParamsSubject(rec.Spec.ID, 0))
			if err != nil {
				return err
			}
			step, err = wire.ParseStep(pm.Header)
			return err
		})
		return step
	}

	ssp := mk("ssp-bad", "ssp", 2)
	inbox := wire.InboxPrefix(ssp.Spec.ID) + ".r"
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	send(ssp, inbox, grad{1, 0, ""})
	expect(sub, wire.ReasonMissingHeader, "Fanin-Version is missing")
	send(ssp, inbox, grad{1, 0, "x1"})
	expect(sub, wire.ReasonBadHeader, "is not a step number")
	send(ssp, inbox, grad{2, 0, "2"})
	expect(sub, wire.ReasonBadHeader, "is not below step 2")
	send(ssp, inbox, grad{4, 0, "0"})
	expect(sub, wire.ReasonFutureStep, "beyond the staleness bound 2")
	send(ssp, inbox, grad{3, 0, "1"})
	expect(sub, wire.ReasonFutureStep, "had not published")
	send(ssp, inbox, grad{1, 0, "0"})
	send(ssp, inbox, grad{2, 0, "0"}) // held: step 1 is still open
	send(ssp, inbox, grad{3, 0, "0"}) // held: t-1-v = 2
	quiet(sub)
	send(ssp, inbox, grad{2, 0, "0"})
	expect(sub, wire.ReasonDuplicate, "rank 0 already sent step 2")
	send(ssp, inbox, grad{1, 1, "0"}) // completes step 1
	send(ssp, inbox, grad{2, 1, "1"}) // completes step 2, held since
	quiet(sub)
	if got := params(ssp); got != 2 {
		t.Fatalf("ssp shard at step %d, want 2", got)
	}
	send(ssp, inbox, grad{2, 1, "1"})
	expect(sub, wire.ReasonStaleStep, "already applied")

	asp := mk("asp-bad", "asp", 0)
	inbox = wire.InboxPrefix(asp.Spec.ID) + ".r"
	sub, err = nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	send(asp, inbox, grad{1, 0, ""})
	expect(sub, wire.ReasonMissingHeader, "Fanin-Version is missing")
	send(asp, inbox, grad{1, 0, "5"})
	expect(sub, wire.ReasonFutureStep, "claims the parameters of step 5")
	send(asp, inbox, grad{1, 0, "0"})
	send(asp, inbox, grad{1, 1, "0"})
	send(asp, inbox, grad{2, 0, "1"})
	quiet(sub)
	if got := params(asp); got != 3 {
		t.Fatalf("asp shard at version %d, want 3 (one per gradient)", got)
	}
	send(asp, inbox, grad{2, 0, "3"})
	expect(sub, wire.ReasonStaleStep, "steps of a rank must grow")
}
