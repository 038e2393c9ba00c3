package gateway_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// A gateway upgraded in place keeps the paused jobs of the one it replaces, whichever way that
// one kept their records: in its own state only ("oldest": it took the record out of the jobs
// bucket while the job was paused), or in its state and in the jobs bucket, marked paused
// ("both"). The record moves to the jobs bucket, where it lives alone (the copy there stands),
// and the job resumes and trains.
func TestPausedJobsSurviveAnUpgrade(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx := context.Background()
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	state, err := js.KeyValue(ctx, gateway.StateBucket)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := js.KeyValue(ctx, wire.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	metaKey := func(id string) string { return "job." + id }

	// What an older gateway left: the job paused, a copy of its record (as created: not marked
	// paused, no worker target) in the job's metadata.
	legacy := func(id string, inJobsBucket bool) *job.Record {
		rec, err := st.Gateway.CreateJob(ctx, smallSpec(id))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Gateway.SetWorkers(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		if err := st.Gateway.Pause(ctx, id, api.StatePaused, "test"); err != nil {
			t.Fatal(err)
		}
		e, err := state.Get(ctx, metaKey(id))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(e.Value(), &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["record"]; ok {
			t.Fatalf("the gateway keeps a record in the metadata of job %s: %s", id, e.Value())
		}
		m["record"] = rec
		val, _ := json.Marshal(m)
		if _, err := state.Put(ctx, metaKey(id), val); err != nil {
			t.Fatal(err)
		}
		if !inJobsBucket {
			if err := jobs.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		return rec
	}
	oldest := legacy("oldest", false)
	legacy("both", true)

	// The upgraded gateway starts on the same NATS (the one of the stack may migrate first:
	// every gateway migrates what it reads).
	gnc, err := st.Connect("gateway-2")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := gateway.New(ctx, gnc, gateway.WithLogger(testutil.Logger()), gateway.WithGovernorInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()

	for _, c := range []struct {
		id      string
		workers int // the jobs bucket's target, when it had the record; else the kept copy's
	}{{"oldest", 0}, {"both", 1}} {
		e, err := state.Get(ctx, metaKey(c.id))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.Unmarshal(e.Value(), &m)
		if _, ok := m["record"]; ok || m["state"] != api.StatePaused {
			t.Errorf("%s: the metadata after the upgrade: %s", c.id, e.Value())
		}
		e, err = jobs.Get(ctx, c.id)
		if err != nil {
			t.Fatalf("%s: not in the jobs bucket after the upgrade: %v", c.id, err)
		}
		var rec job.Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil || !rec.Paused || rec.Workers != c.workers {
			t.Errorf("%s: the jobs bucket holds %s (%v), want it paused, target %d", c.id, e.Value(), err, c.workers)
		}
		sts, err := g2.Status(ctx, c.id, false)
		if err != nil || sts.State != api.StatePaused || sts.Paused {
			t.Errorf("%s: status %+v (%v), want paused (in its state, not its record)", c.id, sts, err)
		}
	}
	if recs, _ := g2.Jobs(ctx); len(recs) != 2 || recs[0].Spec.ID != "both" || recs[1].Spec.ID != "oldest" {
		t.Errorf("jobs after the upgrade: %+v", recs)
	}

	if err := g2.Resume(ctx, "oldest", api.StatePaused); err != nil {
		t.Fatal(err)
	}
	if sts, err := st.Gateway.Status(ctx, "oldest", false); err != nil || sts.State != api.StateRunning {
		t.Fatalf("resumed: %+v (%v)", sts, err)
	}
	testutil.Train(t, st.URL, oldest, 3)
}
