package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/dashboard"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// The dashboard serves its page and files, and its state shows a job that steps, the runtimes
// with the shards placed on them, the autoscaler's decisions, the pool's history, and rejects.
func TestDashboardShowsARunningJob(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, err := nats.Connect(st.URL, nats.Name("dashboard"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	d, err := dashboard.New(ctx, nc, dashboard.WithSampleInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mux := http.NewServeMux()
	mux.Handle(dashboard.RootPattern, d)
	mux.Handle(dashboard.PrefixPattern, d)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for path, want := range map[string]string{"/": "<title>fanin</title>", "/dashboard/app.js": "dashboard/api/state",
		"/dashboard/style.css": ".runtime"} {
		body, ctype := get(t, srv.URL+path)
		if !strings.Contains(body, want) {
			t.Errorf("GET %s (%s) lacks %q", path, ctype, want)
		}
	}

	rec, err := st.Gateway.CreateJob(ctx, job.Spec{ID: "dash", Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Ranks: 2, Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	stop := testutil.TrainUntilStopped(t, st.URL, rec, 20*time.Millisecond)
	defer stop()
	rej := wire.Rejectf(wire.ReasonBadLength, "payload is 3 bytes, shard 0 holds 4096 bytes")
	rej.Job, rej.Shard, rej.Step, rej.Rank = "dash", 0, 1, 1
	if err := nc.Publish(wire.RejectsSubject("dash"), rej.Marshal()); err != nil {
		t.Fatal(err)
	}

	testutil.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		var s dashboard.State
		body, _ := get(t, srv.URL+"/dashboard/api/state")
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			return err
		}
		if len(s.Jobs) != 1 || s.Jobs[0].ID != "dash" {
			return fmt.Errorf("jobs: %+v", s.Jobs)
		}
		j := s.Jobs[0]
		switch {
		case j.State != "running" || j.StepsPerSec <= 0 || j.Step < 1:
			return fmt.Errorf("job not seen running: %+v", j)
		case j.Placed != rec.Layout.NumShards() || j.Shards != rec.Layout.NumShards():
			return fmt.Errorf("job placed %d of %d shards, layout has %d", j.Placed, j.Shards, rec.Layout.NumShards())
		case j.Rejects != 1 || len(s.Rejects) != 1 || s.Rejects[0].Reason != wire.ReasonBadLength:
			return fmt.Errorf("rejects: job %d, recent %+v", j.Rejects, s.Rejects)
		case len(s.Decisions) == 0 || len(s.Decisions[0].Reasons) == 0:
			return fmt.Errorf("decisions: %+v", s.Decisions)
		case len(s.History) < 2 || s.History[len(s.History)-1].Runtimes != 2:
			return fmt.Errorf("history: %+v", s.History)
		}
		placed := 0
		for _, r := range s.Runtimes {
			placed += len(r.Shards)
		}
		if len(s.Runtimes) != 2 || placed != rec.Layout.NumShards() {
			return fmt.Errorf("runtimes: %+v", s.Runtimes)
		}
		return nil
	})
}

func get(t *testing.T, url string) (body, contentType string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %s: %s", url, res.Status, b)
	}
	return string(b), res.Header.Get("Content-Type")
}

// A job's elastic workers are in its row: the target from its record, and each worker of its
// assignment with the ranks it holds; the page has a section that draws them.
func TestDashboardShowsElasticWorkers(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx := context.Background()
	nc, err := nats.Connect(st.URL, nats.Name("dashboard"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	d, err := dashboard.New(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	srv := httptest.NewServer(d)
	defer srv.Close()
	if body, _ := get(t, srv.URL+"/dashboard/app.js"); !strings.Contains(body, "renderWorkers(st.jobs") {
		t.Fatal("app.js does not draw the workers")
	}
	if body, _ := get(t, srv.URL+"/"); !strings.Contains(body, `id="workers"`) {
		t.Fatal("the page has no workers section")
	}

	if _, err := st.Gateway.CreateJob(ctx, job.Spec{ID: "el", Tensors: []job.Tensor{{Name: "w", Shape: []int{8}}},
		Ranks: 3, Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Gateway.SetWorkers(ctx, "el", 2); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, wire.AssignBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	val, _ := json.Marshal(wire.Assignment{Job: "el", Epoch: 4, Target: 2, Updated: now, Workers: []wire.AssignedWorker{
		{ID: "w1", Host: "h1", Ranks: []int{0, 1}, Step: 5, LastBeat: now.Add(-time.Second)},
		{ID: "w2", Host: "h2", Ranks: []int{2}, Step: 5, LastBeat: now},
		{ID: "w3", Host: "h3", Step: 5, LastBeat: now, Standby: true},
	}})
	if _, err := kv.Put(ctx, "el", val); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		var s dashboard.State
		body, _ := get(t, srv.URL+"/dashboard/api/state")
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			return err
		}
		if len(s.Jobs) != 1 {
			return fmt.Errorf("jobs: %+v", s.Jobs)
		}
		j := s.Jobs[0]
		if j.TargetWorkers != 2 || j.Epoch != 4 || len(j.Workers) != 3 {
			return fmt.Errorf("job's workers: %+v", j)
		}
		w1, w3 := j.Workers[0], j.Workers[2]
		if w1.ID != "w1" || fmt.Sprint(w1.Ranks) != "[0 1]" || w1.Step != 5 || w1.BeatAgeMs < 1000 || w1.Standby ||
			!w3.Standby || w3.Ranks == nil || len(w3.Ranks) != 0 {
			return fmt.Errorf("workers: %+v", j.Workers)
		}
		return nil
	})
}
