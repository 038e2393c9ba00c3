package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// GET /v1/jobs/{id}/workers shows a job's assignment, PUT sets its target worker count: within
// 0..ranks, by the job's team or token only, kept across a pause, and followed by the autoscaler
// leader, whose assignment the gateway shows.
func TestJobWorkers(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var teamA, teamB api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", `{"name":"a"}`, 201, &teamA)
	c.call("POST", "/v1/tokens", "application/json", `{"name":"b"}`, 201, &teamB)
	a, b := c.with(teamA.Token), c.with(teamB.Token)
	spec := smallSpec("el")
	spec.Ranks = 4
	var created api.JobCreated
	a.call("POST", "/v1/jobs", "application/json", specJSON(spec), 201, &created)

	// No elastic worker ever beat: an empty list.
	code, _, raw := a.do("GET", "/v1/jobs/el/workers", "", "")
	if code != 200 || !strings.Contains(string(raw), `"workers":[]`) || strings.Contains(string(raw), `"updated"`) {
		t.Fatalf("workers of a job without elastic workers: %d %s", code, raw)
	}
	var ws api.JobWorkers
	_ = json.Unmarshal(raw, &ws)
	if ws.Job != "el" || ws.Ranks != 4 || ws.Target != 0 || ws.Epoch != 0 || ws.Live != 0 {
		t.Fatalf("workers: %+v", ws)
	}
	c.problem("GET", "/v1/jobs/nope/workers", "", "", 404, "job_not_found")
	c.problem("PUT", "/v1/jobs/nope/workers", "application/json", `{"target":1}`, 404, "job_not_found")

	// Another team's token may neither see nor steer the job; the record is unchanged.
	b.problem("GET", "/v1/jobs/el/workers", "", "", 403, string(wire.ReasonForbidden))
	b.problem("PUT", "/v1/jobs/el/workers", "application/json", `{"target":1}`, 403, string(wire.ReasonForbidden))

	// Bad targets.
	for body, want := range map[string]string{
		`{"target":5}`: `job "el" has 4 ranks; give 0`, `{"target":-1}`: "target -1", `{}`: "no target",
		`{"target":"2"}`: "cannot unmarshal", `{"target":1,"min":1}`: `unknown field "min"`, `[1]`: "cannot unmarshal",
	} {
		p := a.problem("PUT", "/v1/jobs/el/workers", "application/json", body, 400, string(wire.ReasonBadParameter))
		if !strings.Contains(p.Detail, want) {
			t.Errorf("PUT %s: %q, want it to say %q", body, p.Detail, want)
		}
	}
	a.problem("PUT", "/v1/jobs/el/workers", "text/plain", `{"target":1}`, 415, string(wire.ReasonMediaType))
	var st0 api.JobStatus
	c.call("GET", "/v1/jobs/el", "", "", 200, &st0)
	if st0.Workers != 0 {
		t.Fatalf("refused requests changed the target to %d", st0.Workers)
	}

	// The team sets it; the record in the jobs bucket says it.
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	jobs, err := js.KeyValue(ctx, wire.JobsBucket)
	if err != nil {
		t.Fatal(err)
	}
	stored := func() job.Record {
		t.Helper()
		e, err := jobs.Get(ctx, "el")
		if err != nil {
			t.Fatal(err)
		}
		var rec job.Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	a.call("PUT", "/v1/jobs/el/workers", "application/json", `{"target":2}`, 200, &ws)
	if ws.Target != 2 || stored().Workers != 2 {
		t.Fatalf("after PUT target 2: answer %+v, stored %d", ws, stored().Workers)
	}
	// The job's own token may steer it too, as it may pause it; the admin token too.
	c.with(created.Token).call("PUT", "/v1/jobs/el/workers", "application/json", `{"target":0}`, 200, &ws)
	c.call("PUT", "/v1/jobs/el/workers", "application/json", `{"target":4}`, 200, &ws)
	if ws.Target != 4 || stored().Workers != 4 {
		t.Fatalf("after PUT target 4: %+v", ws)
	}

	// Set while paused: resume keeps it.
	a.call("POST", "/v1/jobs/el/pause", "", "", 200, nil)
	a.call("PUT", "/v1/jobs/el/workers", "application/json", `{"target":3}`, 200, &ws)
	if rec := stored(); rec.Workers != 3 || !rec.Paused {
		t.Fatalf("set while paused: stored %+v", rec)
	}
	a.call("POST", "/v1/jobs/el/resume", "", "", 200, &st0)
	if rec := stored(); st0.Workers != 3 || rec.Workers != 3 || rec.Paused {
		t.Fatalf("after resume: status %d, stored %+v", st0.Workers, rec)
	}

	// An assignment in the bucket is what the gateway shows.
	assign, err := js.KeyValue(ctx, wire.AssignBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	val, _ := json.Marshal(wire.Assignment{Job: "el", Epoch: 5, Target: 3, Updated: now, Workers: []wire.AssignedWorker{
		{ID: "w1", Host: "h1", Ranks: []int{0, 1}, Step: 9, Joined: now.Add(-time.Minute), LastBeat: now.Add(-1500 * time.Millisecond)},
		{ID: "w2", Host: "h2", Ranks: []int{2, 3}, Step: 9, Joined: now, LastBeat: now},
		{ID: "w3", Host: "h3", Step: 8, Joined: now, LastBeat: now, Standby: true},
	}})
	if _, err := assign.Put(ctx, "el", val); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		a.call("GET", "/v1/jobs/el/workers", "", "", 200, &ws)
		if ws.Epoch != 5 || ws.Live != 3 || ws.Standby != 1 || ws.Target != 3 || ws.Updated == nil {
			return fmt.Errorf("workers %+v", ws)
		}
		return nil
	})
	if w := ws.Workers[0]; w.ID != "w1" || w.Host != "h1" || fmt.Sprint(w.Ranks) != "[0 1]" || w.Step != 9 || w.BeatAgeMs < 1500 || w.BeatAgeMs > 60e3 {
		t.Fatalf("worker w1: %+v", w)
	}
	if w := ws.Workers[2]; !w.Standby || w.Ranks == nil || len(w.Ranks) != 0 {
		t.Fatalf("worker w3: %+v", w)
	}
	var list api.JobList
	a.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].LiveWorkers != 3 || list.Jobs[0].Workers != 3 {
		t.Fatalf("list: %+v", list.Jobs)
	}

	// Deleting the job deletes its assignment.
	a.call("DELETE", "/v1/jobs/el", "", "", 204, nil)
	if _, err := assign.Get(ctx, "el"); err != jetstream.ErrKeyNotFound {
		t.Fatalf("the assignment of a deleted job: %v", err)
	}
}

// Elastic workers beating on a job are assigned its ranks by the autoscaler leader; the target
// set through the API puts the workers beyond it on standby.
func TestJobWorkersFollowBeatsAndTarget(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	spec := smallSpec("beats")
	spec.Ranks = 4
	c.call("POST", "/v1/jobs", "application/json", specJSON(spec), 201, nil)
	nc, err := st.Connect("test-workers")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stop := beat(t, nc, "beats", "w1", "w2")
	defer stop()

	var ws api.JobWorkers
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/jobs/beats/workers", "", "", 200, &ws)
		if ws.Live != 2 || ws.Standby != 0 || len(ws.Workers[0].Ranks)+len(ws.Workers[1].Ranks) != 4 || len(ws.Unassigned) != 0 {
			return fmt.Errorf("workers %+v", ws)
		}
		return nil
	})
	epoch := ws.Epoch
	c.call("PUT", "/v1/jobs/beats/workers", "application/json", `{"target":1}`, 200, nil)
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/jobs/beats/workers", "", "", 200, &ws)
		if ws.Live != 2 || ws.Standby != 1 || ws.Epoch <= epoch || len(ws.Workers[0].Ranks) != 4 || !ws.Workers[1].Standby {
			return fmt.Errorf("workers after target 1: %+v", ws)
		}
		return nil
	})
}

// beat publishes a beat of each worker of job every 250ms until the returned stop is called.
func beat(t *testing.T, nc *nats.Conn, jobID string, workers ...string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, id := range workers {
				data, _ := json.Marshal(wire.WorkerBeat{ID: id, Host: "test", Step: 1})
				_ = nc.Publish(wire.WorkersSubject(jobID), data)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}
