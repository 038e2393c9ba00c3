package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

const wasmTestdata = "../functions/wasmfn/testdata/"

// TestUserFunctions uploads a module as a team, refuses what must be refused (bad modules, other
// bytes under a taken version, another team's function, bad hyper-parameters, deleting a
// function in use), and trains a job through the function on the runtimes: its parameters are
// the bits of the reference running the same module, and of the built-in sgd it imitates.
func TestUserFunctions(t *testing.T) {
	t.Parallel()
	sgdWasm := wasmbuild.ForTest(t, wasmTestdata+"sgd")
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var teamA, teamB api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", `{"name":"a"}`, 201, &teamA)
	c.call("POST", "/v1/tokens", "application/json", `{"name":"b"}`, 201, &teamB)
	a, b := c.with(teamA.Token), c.with(teamB.Token)

	var up gateway.FunctionUpload
	a.call("POST", "/v1/functions?name=sgd&version=1", "application/wasm", string(sgdWasm), 201, &up)
	if up.Function != teamA.ID+"/sgd@1" || up.Digest != wasmfn.Digest(sgdWasm) || !up.Created || len(up.Info.Hyper) != 2 {
		t.Fatalf("upload: %+v", up)
	}
	a.call("POST", "/v1/functions?name=sgd&version=1", "application/wasm", string(sgdWasm), 200, &up)
	if up.Created {
		t.Fatal("the same bytes again created a function")
	}
	a.problem("POST", "/v1/functions?name=sgd&version=1", "application/wasm", string(wasmbuild.ForTest(t, wasmTestdata+"adam")), 409, "function_exists")
	p := a.problem("POST", "/v1/functions?name=bad&version=1", "application/wasm", string(wasmbuild.ForTest(t, wasmTestdata+"badimport")), 400, string(wire.ReasonBadModule))
	if !strings.Contains(p.Detail, "imports env.host_secret") {
		t.Fatalf("forbidden import: %s", p.Detail)
	}
	a.problem("POST", "/v1/functions?name=bad&version=1", "application/wasm", "MZ\x90\x00", 400, string(wire.ReasonBadModule))
	a.problem("POST", "/v1/functions?name=Bad&version=1", "application/wasm", string(sgdWasm), 400, string(wire.ReasonBadParameter))
	a.problem("POST", "/v1/functions?name=x&version=1&owner="+teamB.ID, "application/wasm", string(sgdWasm), 403, string(wire.ReasonForbidden))

	var list struct {
		Functions []functions.FuncInfo   `json:"functions"`
		Modules   []store.FunctionRecord `json:"modules"`
	}
	a.call("GET", "/v1/functions", "", "", 200, &list)
	if len(list.Modules) != 1 || list.Modules[0].Ref() != teamA.ID+"/sgd@1" || len(list.Functions) == 0 {
		t.Fatalf("team a's list: %+v", list.Modules)
	}
	b.call("GET", "/v1/functions", "", "", 200, &list)
	if len(list.Modules) != 0 {
		t.Fatalf("team b sees team a's functions: %+v", list.Modules)
	}

	spec := smallSpec("uf")
	spec.Ranks = 2
	spec.Function = job.Function{Name: teamA.ID + "/sgd@1", Hyper: map[string]float64{"lr": 0.5, "weight_decay": 0.01}}
	p = b.problem("POST", "/v1/jobs", "application/json", specJSON(spec), 400, string(wire.ReasonUnknownFunction))
	if !strings.Contains(p.Detail, "its own functions") {
		t.Fatalf("another team's function: %s", p.Detail)
	}
	noLR := spec
	noLR.Function = job.Function{Name: spec.Function.Name}
	p = a.problem("POST", "/v1/jobs", "application/json", specJSON(noLR), 400, string(wire.ReasonBadHyper))
	if !strings.Contains(p.Detail, "lr: required") {
		t.Fatalf("missing lr: %s", p.Detail)
	}
	a.problem("POST", "/v1/jobs", "application/json", specJSON(func() job.Spec {
		s := spec
		s.Function = job.Function{Name: teamA.ID + "/sgd@2", Hyper: spec.Function.Hyper}
		return s
	}()), 400, string(wire.ReasonUnknownFunction))

	var created api.JobCreated
	a.call("POST", "/v1/jobs", "application/json", specJSON(spec), 201, &created)
	rec := created.Record
	if rec.Spec.Function.Module != up.Digest || rec.Spec.Function.Slots != 0 {
		t.Fatalf("the record's function: %+v", rec.Spec.Function)
	}
	const steps = 5
	testutil.Train(t, st.URL, &rec, steps, sdk.WithJobCredentials(created.Credentials))
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(rec.Spec.ID)), &rec, steps)

	e, err := wasmfn.NewEngine(context.Background(), wasmfn.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	m, err := e.Load(context.Background(), sgdWasm)
	if err != nil {
		t.Fatal(err)
	}
	user, err := m.New(rec.Spec.Function.Name, rec.Spec.Function.Hyper, false)
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := functions.New("sgd", rec.Spec.Function.Hyper)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []functions.Func{user, builtin} {
		want := referenceOf(&rec, fn, steps)
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
				t.Fatalf("%s: element %d: the runtimes have %v, the reference %v", fn.Name(), i, got[i], want[i])
			}
		}
	}

	p = a.problem("DELETE", "/v1/functions/"+teamA.ID+"/sgd@1", "", "", 409, "function_in_use")
	if !strings.Contains(p.Detail, "uf") {
		t.Fatalf("in use: %s", p.Detail)
	}
	b.problem("DELETE", "/v1/functions/"+teamA.ID+"/sgd@1", "", "", 404, "function_not_found")
	a.call("DELETE", "/v1/jobs/uf", "", "", 204, nil)
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code, _, body := a.do("DELETE", "/v1/functions/"+teamA.ID+"/sgd@1", "", ""); code != 204 {
			return fmt.Errorf("delete: %d %s", code, body)
		}
		return nil
	})
	a.call("GET", "/v1/functions", "", "", 200, &list)
	if len(list.Modules) != 0 {
		t.Fatalf("after delete: %+v", list.Modules)
	}
}

// referenceOf runs the job's reference with fn over steps steps of testutil.Gradient.
func referenceOf(rec *job.Record, fn functions.Func, steps int64) []float32 {
	p0 := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, p0)
	ref := functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), p0)
	grads := make([][]float32, rec.Spec.Ranks)
	for step := int64(1); step <= steps; step++ {
		for r := range grads {
			grads[r] = make([]float32, len(p0))
			testutil.Gradient(grads[r], ref.Params(), step, r)
		}
		ref.Step(grads, nil)
	}
	return ref.Params()
}

// TestFailingFunctionPausesJob: a function that fails every step is refused with
// function_failed, the shard keeps its step-0 parameters, and the job ends paused.
func TestFailingFunctionPausesJob(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	c.call("POST", "/v1/functions?name=attack&version=1", "application/wasm", string(wasmbuild.ForTest(t, wasmTestdata+"attack")), 201, nil)
	spec := smallSpec("bad-fn")
	spec.Tensors = []job.Tensor{{Name: "w", Shape: []int{100}}}                                // one shard
	spec.Function = job.Function{Name: "admin/attack@1", Hyper: map[string]float64{"mode": 5}} // returns an error
	var created api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(spec), 201, &created)
	rec := created.Record
	stop := testutil.TrainUntilStoppedWith(t, st.URL, &rec, 0, sdk.WithJobCredentials(created.Credentials))
	defer stop()
	testutil.CheckFor(t, 2*time.Minute, 50*time.Millisecond, func() error {
		var s api.JobStatus
		c.call("GET", "/v1/jobs/bad-fn", "", "", 200, &s)
		if s.State != api.StatePaused {
			_, _, body := c.do("GET", "/v1/jobs/bad-fn/rejects", "", "")
			return fmt.Errorf("job is %s; rejects: %.600s", s.State, body)
		}
		return nil
	})
	var rejects struct {
		Recent []wire.Reject `json:"recent"`
	}
	code, _, body := c.do("GET", "/v1/jobs/bad-fn/rejects", "", "")
	if code != 200 || json.Unmarshal(body, &rejects) != nil {
		t.Fatalf("rejects: %d %s", code, body)
	}
	found := false
	for _, r := range rejects.Recent {
		found = found || (r.Reason == wire.ReasonFunctionFailed && strings.Contains(r.Detail, "refusing on purpose") && r.Step == 1)
	}
	if !found {
		t.Fatalf("no function_failed rejection of step 1 naming the function's error: %s", body)
	}
}

// A module that does not start within the start limit (a gateway too busy to start it, or a start
// that never ends: here a limit of a microsecond) is not called bad: the upload answers 503 with
// Retry-After and the reason, and nothing is stored.
func TestFunctionStartTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	slow := authStack(t, 1, gateway.WithFunctionLimits(wasmfn.Limits{StartTimeout: time.Microsecond}))
	module := string(wasmbuild.ForTest(t, wasmTestdata+"sgd"))
	c := client{t: t, base: slow.HTTPURL, token: slow.AdminToken}
	code, h, data := c.do("POST", "/v1/functions?name=slow&version=1", "application/wasm", module)
	var p api.Problem
	if err := json.Unmarshal(data, &p); err != nil || code != 503 || p.Code != "function_start_timeout" || h.Get("Retry-After") == "" ||
		!strings.Contains(p.Detail, "did not start within") {
		t.Fatalf("upload that could not start in time: %d %s (Retry-After %q), want 503 function_start_timeout with Retry-After", code, data, h.Get("Retry-After"))
	}
	var list struct {
		Modules []store.FunctionRecord `json:"modules"`
	}
	c.call("GET", "/v1/functions", "", "", 200, &list)
	if len(list.Modules) != 0 {
		t.Fatalf("a module that did not start was stored: %+v", list.Modules)
	}
	// The module itself is good: a gateway that can start it in time takes it.
	st := authStack(t, 1)
	c = client{t: t, base: st.HTTPURL, token: st.AdminToken}
	c.call("POST", "/v1/functions?name=slow&version=1", "application/wasm", module, 201, nil)
}
