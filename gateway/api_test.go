package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// Every route, with the admin token: what it answers, and its error cases.
func TestAPIRoutes(t *testing.T) {
	t.Parallel()
	st := authStack(t, 2)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}

	var health map[string]string
	c.with("").call("GET", "/healthz", "", "", 200, &health)
	var who api.Whoami
	c.call("GET", "/v1/whoami", "", "", 200, &who)
	if who.Kind != "admin" {
		t.Fatalf("whoami: %+v", who)
	}
	c.with("").call("GET", "/v1/openapi.json", "", "", 200, nil)
	c.problem("GET", "/v1/nothing", "", "", 404, "not_found")
	c.problem("PATCH", "/v1/jobs", "", "", 405, "method_not_allowed")

	var fns struct{ Functions []functions.FuncInfo }
	c.call("GET", "/v1/functions", "", "", 200, &fns)
	if len(fns.Functions) != len(functions.Describe()) || fns.Functions[0].Name == "" {
		t.Fatalf("functions: %+v", fns)
	}

	// Jobs: create (token and credentials come back), list, get, shards.
	var created api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("tiny")), 201, &created)
	if created.Token == "" || created.Credentials == nil || !strings.Contains(created.Credentials.Creds, "NATS USER JWT") ||
		created.Credentials.InboxPrefix != "fanin.v1.tiny.inbox" || created.Layout.NumShards() != 3 || created.State != api.StateRunning {
		t.Fatalf("create: %+v", created)
	}
	c.problem("POST", "/v1/jobs", "application/json", specJSON(smallSpec("tiny")), 409, "job_exists")
	var list api.JobList
	c.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].Spec.ID != "tiny" || list.Jobs[0].Shards != nil {
		t.Fatalf("list: %+v", list)
	}
	var status api.JobStatus
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/jobs/tiny", "", "", 200, &status)
		if status.Placed != 3 || status.Step != 0 || len(status.Shards) != 3 || status.Shards[0].Runtime == "" {
			return fmt.Errorf("status %+v", status)
		}
		return nil
	})
	var shards struct {
		Job    string
		Shards []api.ShardStatus
	}
	c.call("GET", "/v1/jobs/tiny/shards", "", "", 200, &shards)
	if shards.Job != "tiny" || len(shards.Shards) != 3 || shards.Shards[2].Bytes != 40 {
		t.Fatalf("shards: %+v", shards)
	}
	c.problem("GET", "/v1/jobs/nope", "", "", 404, "job_not_found")
	c.problem("GET", "/v1/jobs/nope/shards", "", "", 404, "job_not_found")
	c.problem("GET", "/v1/jobs/Not.A.Job", "", "", 400, string(wire.ReasonBadParameter))

	// Train two steps with the job's own credentials; status follows.
	ncJob := natsAs(t, st.URL, created.Credentials, nil)
	jsJob, _ := jetstream.New(ncJob)
	rec := &created.Record
	params := paramsAt(t, jsJob, rec, 0)
	grads := [][]float32{make([]float32, rec.Layout.Elements)}
	for step := int64(1); step <= 2; step++ {
		publishStep(t, jsJob, rec, params, step, grads)
		params = paramsAt(t, jsJob, rec, step)
	}
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/jobs/tiny", "", "", 200, &status)
		if status.Step != 2 || status.Shards[0].Lag != 0 {
			return fmt.Errorf("status after 2 steps: step %d", status.Step)
		}
		return nil
	})

	// Placement and the pool.
	var placement struct{ Placement []api.Placement }
	c.call("GET", "/v1/placement", "", "", 200, &placement)
	if len(placement.Placement) != 3 || placement.Placement[0].Job != "tiny" || placement.Placement[0].Epoch < 1 {
		t.Fatalf("placement: %+v", placement)
	}
	var pool api.Pool
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/runtimes", "", "", 200, &pool)
		if len(pool.Runtimes) != 2 || pool.Placed != 3 || pool.Shards != 3 || pool.Runtimes[0].Reported == nil {
			return fmt.Errorf("pool %+v", pool)
		}
		return nil
	})
	var rt api.RuntimeStatus
	c.call("GET", "/v1/runtimes/"+pool.Runtimes[0].ID, "", "", 200, &rt)
	if rt.ID != pool.Runtimes[0].ID || rt.Cores < 1 {
		t.Fatalf("runtime: %+v", rt)
	}
	if want := st.NATS.Name(); rt.Server != want || rt.Node != want { // no --node: the server names the node
		t.Fatalf("runtime's server %q and node %q, want %q", rt.Server, rt.Node, want)
	}
	c.problem("GET", "/v1/runtimes/rt-99", "", "", 404, "runtime_not_found")

	// Policy: the default, a replacement the autoscaler follows, its history; bad ones refused.
	var pol api.PolicyDoc
	c.call("GET", "/v1/policy", "", "", 200, &pol)
	if pol.Source != "default" || !strings.Contains(pol.YAML, "min_runtimes: 2") {
		t.Fatalf("default policy: %+v", pol)
	}
	c.call("PUT", "/v1/policy", "application/yaml", "min_runtimes: 2\nmax_runtimes: 3\ntarget_utilization: 0.7\n", 200, &pol)
	if pol.Source != "stored" || pol.Revision == 0 {
		t.Fatalf("stored policy: %+v", pol)
	}
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if p := st.Autoscaler.Policy(); p.TargetUtilization != 0.7 || p.MaxRuntimes != 3 {
			return fmt.Errorf("the autoscaler follows %+v", p)
		}
		return nil
	})
	c.problem("PUT", "/v1/policy", "application/yaml", "target_utilization: 7\n", 400, string(wire.ReasonInvalidPolicy))
	c.problem("PUT", "/v1/policy", "application/yaml", "colour: blue\n", 400, string(wire.ReasonInvalidPolicy))
	c.problem("PUT", "/v1/policy", "text/plain", "min_runtimes: 1\n", 415, string(wire.ReasonMediaType))
	c.call("PUT", "/v1/policy", "application/json", `{"min_runtimes": 2, "max_runtimes": 4}`, 200, &pol)
	var hist struct{ History []api.PolicyRevision }
	c.call("GET", "/v1/policy/history", "", "", 200, &hist)
	if len(hist.History) != 2 || hist.History[0].Revision >= hist.History[1].Revision || hist.History[1].Policy == nil {
		t.Fatalf("history: %+v", hist)
	}
	if p, err := autoscaler.ParsePolicy([]byte(hist.History[0].YAML)); err != nil || p.TargetUtilization != 0.7 {
		t.Fatalf("first revision: %+v %v", p, err)
	}

	// Decisions.
	var ds struct{ Decisions []autoscaler.Decision }
	testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		c.call("GET", "/v1/decisions?limit=5", "", "", 200, &ds)
		if len(ds.Decisions) == 0 || len(ds.Decisions) > 5 || len(ds.Decisions[0].Reasons) == 0 {
			return fmt.Errorf("decisions %+v", ds)
		}
		return nil
	})
	c.problem("GET", "/v1/decisions?limit=0", "", "", 400, string(wire.ReasonBadParameter))
	c.problem("GET", "/v1/decisions?limit=abc", "", "", 400, string(wire.ReasonBadParameter))

	// Pause: nothing placed, gradients queue; resume: they are applied, bit-exact.
	c.call("POST", "/v1/jobs/tiny/pause", "", "", 200, &status)
	if status.State != api.StatePaused || status.Placed != 0 || status.Step != 2 {
		t.Fatalf("paused: state %s placed %d step %d", status.State, status.Placed, status.Step)
	}
	c.problem("POST", "/v1/jobs/tiny/pause", "", "", 409, "bad_state")
	publishStep(t, jsJob, rec, params, 3, grads) // acknowledged: the stream keeps them
	// Nothing may be applied: the sleep gives it time to be, if it could.
	time.Sleep(300 * time.Millisecond)
	c.call("GET", "/v1/jobs/tiny", "", "", 200, &status)
	if status.Step != 2 || status.Placed != 0 {
		t.Fatalf("a paused job advanced: step %d, placed %d", status.Step, status.Placed)
	}
	c.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].State != api.StatePaused {
		t.Fatalf("list while paused: %+v", list)
	}
	// A worker can join a paused job (a restarted one, say, while the quota governor throttles).
	joiner, err := sdk.Connect(context.Background(), st.URL, sdk.WithJobCredentials(created.Credentials))
	if err != nil {
		t.Fatal(err)
	}
	defer joiner.Close()
	jw, err := joiner.Worker(context.Background(), "tiny", 0)
	if err != nil {
		t.Fatalf("a worker joining a paused job: %v", err)
	}
	if step, _, err := jw.Params(context.Background()); err != nil || step != 2 {
		t.Fatalf("a worker joining a paused job reads step %d (%v), want 2", step, err)
	}
	c.call("POST", "/v1/jobs/tiny/resume", "", "", 200, &status)
	if status.State != api.StateRunning {
		t.Fatalf("resumed: %s", status.State)
	}
	c.problem("POST", "/v1/jobs/tiny/resume", "", "", 409, "bad_state")
	got := paramsAt(t, jsJob, rec, 3)
	if !bytes.Equal(f32bytes(got), f32bytes(reference(t, rec, 3))) {
		t.Fatal("after pause and resume the parameters differ from the reference")
	}

	// More credentials for the job; rejects of the job (none yet from the data plane).
	var more api.Credentials
	c.call("POST", "/v1/jobs/tiny/credentials", "", "", 201, &more)
	if more.User == created.Credentials.User || more.Seed == "" {
		t.Fatalf("new credentials: %+v", more)
	}
	natsAs(t, st.URL, &more, nil)
	var rj api.Rejects
	c.call("GET", "/v1/jobs/tiny/rejects?limit=10", "", "", 200, &rj)
	if rj.Job != "tiny" {
		t.Fatalf("rejects: %+v", rj)
	}
	c.problem("GET", "/v1/jobs/tiny/rejects?limit=-1", "", "", 400, string(wire.ReasonBadParameter))
	c.problem("GET", "/v1/jobs/nope/rejects", "", "", 404, "job_not_found")

	// Team tokens.
	var team api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", `{"name":"vision","quota":{"jobs":2,"shards":100}}`, 201, &team)
	if !strings.HasPrefix(team.Token, "fanin_team_") || team.ID == "" || strings.Contains(team.Hint, team.Token[16:]) {
		t.Fatalf("team: %+v", team)
	}
	c.problem("POST", "/v1/tokens", "application/json", `{"name":""}`, 400, string(wire.ReasonBadParameter))
	c.problem("POST", "/v1/tokens", "application/json", `{"name":"x","quota":{"jobs":-1}}`, 400, string(wire.ReasonBadParameter))
	c.problem("POST", "/v1/tokens", "application/json", `{"name":"x","color":1}`, 400, string(wire.ReasonBadParameter))
	c.problem("POST", "/v1/tokens", "application/yaml", `name: x`, 415, string(wire.ReasonMediaType))
	var teams struct{ Tokens []api.Team }
	c.call("GET", "/v1/tokens", "", "", 200, &teams)
	if len(teams.Tokens) != 1 || teams.Tokens[0].ID != team.ID || teams.Tokens[0].Quota.Jobs != 2 {
		t.Fatalf("teams: %+v", teams)
	}
	c.call("DELETE", "/v1/tokens/"+team.ID, "", "", 204, nil)
	c.problem("DELETE", "/v1/tokens/"+team.ID, "", "", 404, "token_not_found")
	c.with(team.Token).problem("GET", "/v1/jobs", "", "", 401, string(wire.ReasonUnauthorized))

	// Delete drains, removes the streams, the state and revokes the credentials.
	c.call("DELETE", "/v1/jobs/tiny", "", "", 204, nil)
	c.problem("GET", "/v1/jobs/tiny", "", "", 404, "job_not_found")
	c.problem("DELETE", "/v1/jobs/tiny", "", "", 404, "job_not_found")
	c.with(created.Token).problem("GET", "/v1/jobs/tiny", "", "", 401, string(wire.ReasonUnauthorized))
	admin, err := st.Connect("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(admin)
	for _, name := range []string{wire.GradStream("tiny"), wire.ParamsStream("tiny")} {
		if _, err := js.Stream(context.Background(), name); err == nil {
			t.Fatalf("stream %s survived the job", name)
		}
	}
	kv, _ := js.KeyValue(context.Background(), wire.HandoverBucket)
	if keys, _ := kv.ListKeys(context.Background()); keys != nil {
		for k := range keys.Keys() {
			if strings.HasPrefix(k, "tiny.") {
				t.Fatalf("handover key %s survived the job", k)
			}
		}
	}
	// The placement's revisions go with the job (purged), not only its current value.
	pkv, _ := js.KeyValue(context.Background(), wire.PlacementBucket)
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		for sh := range 3 {
			hist, err := pkv.History(context.Background(), wire.PlacementKey("tiny", sh))
			if err == nil && (len(hist) != 1 || hist[0].Operation() != jetstream.KeyValuePurge) {
				return fmt.Errorf("placement of shard %d keeps %d revisions after the job", sh, len(hist))
			}
		}
		return nil
	})
	testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if ncJob.IsConnected() {
			return fmt.Errorf("the deleted job's credentials are still connected")
		}
		return nil
	})
	c.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 0 {
		t.Fatalf("jobs after delete: %+v", list)
	}
	// The same id can be created again, with new credentials; the old ones stay revoked.
	var again api.JobCreated
	c.call("POST", "/v1/jobs", "application/yaml", "id: tiny\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sum}\nshard_size: 4KiB\n", 201, &again)
	if _, err := sdk.Connect(context.Background(), st.URL, sdk.WithJobCredentials(created.Credentials)); err == nil {
		t.Fatal("revoked credentials connected again")
	}
	if cl, err := sdk.Connect(context.Background(), st.URL, sdk.WithJobCredentials(again.Credentials)); err != nil {
		t.Fatalf("new credentials: %v", err)
	} else {
		cl.Close()
	}
}

// reference computes a job's parameters after steps steps of testutil.Gradient from every rank,
// in one process (functions.Reference).
func reference(t testing.TB, rec *job.Record, steps int64) []float32 {
	t.Helper()
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		t.Fatal(err)
	}
	init := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, init)
	ref := functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), init)
	grads := make([][]float32, rec.Spec.Ranks)
	for r := range grads {
		grads[r] = make([]float32, rec.Layout.Elements)
	}
	for step := int64(1); step <= steps; step++ {
		for r := range grads {
			testutil.Gradient(grads[r], ref.Params(), step, r)
		}
		ref.Step(grads, nil)
	}
	return ref.Params()
}

// GET /v1/metrics/targets lists the runtimes that registered a metrics URL, in the format of
// Prometheus's HTTP service discovery; runtimes without one are left out.
func TestMetricsTargets(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1) // rt-0 serves no metrics
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, wire.RuntimesBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(wire.RuntimeInfo{ID: "rt-m", Cores: 2, Started: time.Now().UTC(), Beat: time.Now().UTC(),
		Metrics: "http://127.0.0.1:9464/metrics"})
	if _, err := kv.Put(ctx, "rt-m", info); err != nil {
		t.Fatal(err)
	}
	var groups []api.TargetGroup
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		c.call("GET", "/v1/metrics/targets", "", "", 200, &groups)
		if len(groups) != 1 {
			return fmt.Errorf("targets %+v, want rt-m's only", groups)
		}
		return nil
	})
	want := api.TargetGroup{Targets: []string{"127.0.0.1:9464"},
		Labels: map[string]string{"fanin_runtime_id": "rt-m", "__scheme__": "http", "__metrics_path__": "/metrics"}}
	if !reflect.DeepEqual(groups[0], want) {
		t.Fatalf("target group %+v, want %+v", groups[0], want)
	}
	c.with("").problem("GET", "/v1/metrics/targets", "", "", 401, string(wire.ReasonUnauthorized))
}
