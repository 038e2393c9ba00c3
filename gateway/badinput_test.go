package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestBadInputEverywhere sends every class of malformed input fanin knows, on the data plane
// (gradient messages), with credentials (NATS), and to the API, while another job trains. Each is
// refused with its specific reason, counted under its job and reason, and kept for
// GET /v1/jobs/{id}/rejects; the other job trains on undisturbed, and both jobs' parameters end
// byte-identical to the single-process reference.
func TestBadInputEverywhere(t *testing.T) {
	t.Parallel()
	st := authStack(t, 2)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	ctx := context.Background()

	vspec := job.Spec{
		ID:        "victim",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{64, 40}}, {Name: "b", Shape: []int{40}}, {Name: "v", Shape: []int{3000}}},
		Ranks:     4,
		Function:  job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		Init:      job.Init{Kind: "normal", Seed: 7, Scale: 0.1},
		ShardSize: 4 << 10,
	}
	var victim, other api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(vspec), 201, &victim)
	ospec := smallSpec("other")
	ospec.Ranks = 2
	c.call("POST", "/v1/jobs", "application/json", specJSON(ospec), 201, &other)
	rec := &victim.Record

	// The other job trains throughout, paced, with its own credentials.
	const otherSteps = 60
	var wg sync.WaitGroup
	finals := make([][]float32, ospec.Ranks)
	trainErr := make(chan error, ospec.Ranks)
	for r := range ospec.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := sdk.Connect(ctx, st.URL, sdk.WithJobCredentials(other.Credentials))
			if err != nil {
				trainErr <- err
				return
			}
			defer cl.Close()
			w, err := cl.Worker(ctx, "other", r)
			if err != nil {
				trainErr <- err
				return
			}
			defer w.Close()
			step, params, err := w.Params(ctx)
			if err != nil {
				trainErr <- err
				return
			}
			g := make([]float32, len(params))
			for ; step < otherSteps; step++ {
				testutil.Gradient(g, params, step+1, r)
				if params, err = w.Step(ctx, g); err != nil {
					trainErr <- fmt.Errorf("other rank %d step %d: %w", r, step+1, err)
					return
				}
				time.Sleep(100 * time.Millisecond) // the bystander trains at its own pace meanwhile
			}
			finals[r] = append([]float32(nil), params...)
		}()
	}

	// The victim's workers: its own credentials; rejections come back to their inbox.
	errsV := make(chan error, 16)
	ncV := natsAs(t, st.URL, victim.Credentials, errsV)
	jsV, _ := jetstream.New(ncV)
	inbox := ncV.NewInbox()
	reports, err := ncV.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	shard := rec.Layout.Shards[1]
	good := func(step int64, rank int, data []byte) *nats.Msg {
		m := gradMsg("victim", shard.ID, step, rank, data)
		m.Header.Del(wire.HdrMsgID)
		m.Header.Set(wire.HdrReplyTo, inbox)
		return m
	}
	zeros := make([]byte, shard.Bytes())
	withNaN := bytes.Clone(zeros)
	binary.LittleEndian.PutUint32(withNaN[40:], math.Float32bits(float32(math.NaN())))
	grads := make([][]float32, vspec.Ranks)
	for r := range grads {
		grads[r] = make([]float32, rec.Layout.Elements)
	}
	params := paramsAt(t, jsV, rec, 0)
	for step := int64(1); step <= 2; step++ {
		publishStep(t, jsV, rec, params, step, grads)
		params = paramsAt(t, jsV, rec, step)
	}
	// Step 3 is open on shard 1: every rank but rank 0 has sent it.
	for r := range grads {
		testutil.Gradient(grads[r], params, 3, r)
		for _, s := range rec.Layout.Shards {
			if s.ID == shard.ID && r == 0 {
				continue
			}
			if _, err := jsV.PublishMsg(ctx, gradMsg("victim", s.ID, 3, r, f32bytes(grads[r][s.Off:s.Off+s.Len]))); err != nil {
				t.Fatal(err)
			}
		}
	}

	// How each class is observed by its sender.
	dataPlane := func(m func() *nats.Msg) func() wire.Reason {
		return func() wire.Reason {
			if _, err := jsV.PublishMsg(ctx, m()); err != nil {
				t.Fatalf("publish: %v", err)
			}
			rm, err := reports.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no rejection report: %v", err)
			}
			rej, err := wire.UnmarshalReject(rm.Data)
			if err != nil || rej.Job != "victim" || rej.Detail == "" || rm.Header.Get(wire.HdrReject) != string(rej.Reason) {
				t.Fatalf("report %+v (%v)", rej, err)
			}
			return rej.Reason
		}
	}
	withHeader := func(key, val string) func() *nats.Msg {
		return func() *nats.Msg {
			m := good(3, 0, zeros)
			if val == "" {
				m.Header.Del(key)
			} else {
				m.Header.Set(key, val)
			}
			return m
		}
	}
	apiCall := func(tok, method, path, ctype, body string) func() wire.Reason {
		return func() wire.Reason {
			code, h, data := c.with(tok).do(method, path, ctype, body)
			if code < 400 || h.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s: %d %s", method, path, code, data)
			}
			var p api.Problem
			_ = jsonUnmarshal(data, &p)
			return wire.Reason(p.Code)
		}
	}
	denied := func(substr string) wire.Reason {
		deadline := time.After(5 * time.Second)
		for {
			select {
			case err := <-errsV:
				if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), substr) {
					return wire.ReasonForbidden
				}
			case <-deadline:
				t.Fatalf("no permissions violation for %s", substr)
			}
		}
	}
	badSpec := func(edit func(*job.Spec)) string {
		s := vspec
		s.Function.Hyper = map[string]float64{"lr": 0.1}
		edit(&s)
		return specJSON(s)
	}
	kp, _ := nkeys.CreateUser()
	wrongSeed, _ := kp.Seed()
	foreign, _ := auth.New()
	foreignCreds, _ := foreign.JobCredentials(auth.JobAccount{Job: "victim", Created: time.Now()}, 0)

	cases := []struct {
		name string
		job  string // the job it is counted under; "": not recorded
		want wire.Reason
		send func() wire.Reason
	}{
		// The data plane: gradient messages with the victim's own credentials.
		{"short payload", "victim", wire.ReasonBadLength, dataPlane(func() *nats.Msg { return good(3, 0, zeros[:100]) })},
		{"not whole floats", "victim", wire.ReasonBadLength, dataPlane(func() *nats.Msg { return good(3, 0, zeros[:len(zeros)-1]) })},
		{"oversized payload", "victim", wire.ReasonOversized, dataPlane(func() *nats.Msg { return good(3, 0, make([]byte, shard.Bytes()+4)) })},
		{"rank out of range", "victim", wire.ReasonRankRange, dataPlane(func() *nats.Msg { return good(3, 4, zeros) })},
		{"stale step", "victim", wire.ReasonStaleStep, dataPlane(func() *nats.Msg { return good(2, 0, zeros) })},
		{"future step", "victim", wire.ReasonFutureStep, dataPlane(func() *nats.Msg { return good(5, 0, zeros) })},
		{"duplicate rank", "victim", wire.ReasonDuplicate, dataPlane(func() *nats.Msg { return good(3, 1, zeros) })},
		{"NaN", "victim", wire.ReasonNonFinite, dataPlane(func() *nats.Msg { return good(3, 0, withNaN) })},
		{"missing step header", "victim", wire.ReasonMissingHeader, dataPlane(withHeader(wire.HdrStep, ""))},
		{"malformed step header", "victim", wire.ReasonBadHeader, dataPlane(withHeader(wire.HdrStep, "-3"))},
		{"unsupported dtype", "victim", wire.ReasonBadDtype, dataPlane(withHeader(wire.HdrDtype, "f64"))},
		{"unknown shard", "victim", wire.ReasonUnknownShard, dataPlane(func() *nats.Msg {
			m := good(3, 0, zeros)
			m.Subject = wire.GradSubject("victim", 99)
			return m
		})},
		// Credentials: refused or denied by the NATS server, reported to fanin.
		{"stolen JWT, wrong seed", "victim", wire.ReasonUnauthorized, func() wire.Reason {
			nc, err := nats.Connect(st.URL, nats.UserJWTAndSeed(victim.Credentials.JWT, string(wrongSeed)))
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if errors.Is(err, nats.ErrAuthorization) {
				return wire.ReasonUnauthorized
			}
			return wire.Reason(err.Error())
		}},
		{"credentials of another operator", gateway.NATSJob, wire.ReasonUnauthorized, func() wire.Reason {
			nc, err := nats.Connect(st.URL, foreignCreds.NATSOptions()...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			return wire.ReasonUnauthorized
		}},
		{"publish to another job", "victim", wire.ReasonForbidden, func() wire.Reason {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := jsV.PublishMsg(sctx, gradMsg("other", 0, 1, 0, make([]byte, 4*1000))); err == nil {
				t.Fatal("published to another job's gradients")
			}
			return denied(`Publish to "fanin.v1.other.grad.0"`)
		}},
		{"read another job's parameters", "victim", wire.ReasonForbidden, func() wire.Reason {
			if _, err := ncV.SubscribeSync(wire.ParamsWildcard("other")); err != nil {
				t.Fatal(err)
			}
			return denied(`Subscription to "fanin.v1.other.params.*"`)
		}},
		// The API.
		{"invalid spec", "victim", wire.ReasonInvalidSpec, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/json", badSpec(func(s *job.Spec) { s.Ranks = 0 }))},
		{"unknown spec field", "victim", wire.ReasonInvalidSpec, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/yaml", "id: victim\ncolour: blue\n")},
		{"unknown function", "victim", wire.ReasonUnknownFunction, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/json", badSpec(func(s *job.Spec) { s.Function.Name = "lbfgs" }))},
		{"bad hyper-parameter", "victim", wire.ReasonBadHyper, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/json", badSpec(func(s *job.Spec) { s.Function.Hyper["lr"] = -1 }))},
		{"huge body", gateway.NoJob, wire.ReasonBodyTooLarge, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/json",
			`{"id":"victim","tensors":[`+strings.Repeat(`{"name":"t","shape":[1]},`, gateway.MaxSpecBytes/20)+`]}`)},
		{"deeply nested JSON", gateway.NoJob, wire.ReasonTooDeep, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/json",
			`{"id":"victim","tensors":`+strings.Repeat("[", 10000)+strings.Repeat("]", 10000)+`}`)},
		{"deeply nested YAML", gateway.NoJob, wire.ReasonTooDeep, apiCall(st.AdminToken, "POST", "/v1/jobs", "application/yaml", deepYAML(40))},
		{"wrong content type", gateway.NoJob, wire.ReasonMediaType, apiCall(st.AdminToken, "POST", "/v1/jobs", "text/plain", specJSON(vspec))},
		{"no token", "", wire.ReasonUnauthorized, apiCall("", "GET", "/v1/jobs/victim", "", "")}, // not recorded
		{"another job's token", gateway.NoJob, wire.ReasonForbidden, apiCall(other.Token, "GET", "/v1/jobs/victim", "", "")},
		{"malformed query", "victim", wire.ReasonBadParameter, apiCall(victim.Token, "GET", "/v1/jobs/victim/rejects?limit=lots", "", "")},
	}
	if len(cases) < 12 {
		t.Fatalf("only %d classes", len(cases))
	}
	var startStep api.JobStatus
	c.call("GET", "/v1/jobs/other", "", "", 200, &startStep)
	want := map[string]map[wire.Reason]int64{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := c.counts(tc.job)[tc.want]
			if got := tc.send(); got != tc.want {
				t.Fatalf("reason %q, want %q", got, tc.want)
			}
			if tc.job == "" {
				return // refused, not recorded (a 401)
			}
			c.awaitCount(tc.job, tc.want, before+1)
			if want[tc.job] == nil {
				want[tc.job] = map[wire.Reason]int64{}
			}
			want[tc.job][tc.want]++
		})
	}

	// Counted exactly once each, under their job and reason, and kept.
	for jobID, counts := range want {
		got := c.counts(jobID)
		for r, n := range counts {
			if got[r] != n {
				t.Errorf("job %s: %s counted %d times, want %d", jobID, r, got[r], n)
			}
		}
		if len(got) != len(counts) {
			t.Errorf("job %s: counts %v, want %v", jobID, got, counts)
		}
	}
	var rj api.Rejects
	c.with(victim.Token).call("GET", "/v1/jobs/victim/rejects?limit=1000", "", "", 200, &rj)
	var total int64
	for _, n := range want["victim"] {
		total += n
	}
	if rj.Total != total || int64(len(rj.Recent)) != total {
		t.Fatalf("victim's rejects: total %d, %d kept; want %d", rj.Total, len(rj.Recent), total)
	}
	sources := map[string]int{}
	for _, r := range rj.Recent {
		sources[r.Source]++
	}
	if sources["runtime"] != 12 || sources["nats"] != 3 || sources["gateway"] != int(total)-15 {
		t.Fatalf("sources of the victim's rejections: %v", sources)
	}

	// The other job kept training meanwhile.
	var endStep api.JobStatus
	c.call("GET", "/v1/jobs/other", "", "", 200, &endStep)
	if endStep.Step <= startStep.Step {
		t.Fatalf("the other job did not train while the bad inputs came: step %d -> %d", startStep.Step, endStep.Step)
	}

	// The open step completes with the real rank-0 gradient: the result is the reference's.
	if _, err := jsV.PublishMsg(ctx, good(3, 0, f32bytes(grads[0][shard.Off:shard.Off+shard.Len]))); err != nil {
		t.Fatal(err)
	}
	got := paramsAt(t, jsV, rec, 3)
	if !bytes.Equal(f32bytes(got), f32bytes(reference(t, rec, 3))) {
		t.Fatal("after the bad inputs, the victim's parameters differ from the reference")
	}
	if m, err := reports.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a good gradient was reported as rejected: %s", m.Data)
	}
	wg.Wait()
	close(trainErr)
	for err := range trainErr {
		t.Fatal(err)
	}
	oref := reference(t, &other.Record, otherSteps)
	for r, p := range finals {
		if !bytes.Equal(f32bytes(p), f32bytes(oref)) {
			t.Fatalf("the other job's rank %d ended with parameters that differ from the reference", r)
		}
	}
}

// deepYAML is a block-style YAML mapping nested depth levels deep.
func deepYAML(depth int) string {
	var b strings.Builder
	b.WriteString("id: victim\ninit:\n")
	for i := range depth {
		fmt.Fprintf(&b, "%s k%d:\n", strings.Repeat(" ", i+1), i)
	}
	fmt.Fprintf(&b, "%s leaf: 1\n", strings.Repeat(" ", depth+1))
	return b.String()
}

// Small bad inputs of the API: a workers request with a key given twice is refused as a job spec
// would be (a lenient decoder keeps the last); a team name with a control character is refused;
// a refused job creation is not counted against the job created next under the same id.
func TestBadInputSmall(t *testing.T) {
	t.Parallel()
	st := authStack(t, 0)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var created api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("twice")), 201, &created)

	p := c.problem("PUT", "/v1/jobs/twice/workers", "application/json", `{"target": 1, "target": 0}`, 400, string(wire.ReasonBadParameter))
	if !strings.Contains(p.Detail, `"target" is given twice`) {
		t.Fatalf("a workers request with a key given twice: %s", p.Detail)
	}
	var ws api.JobWorkers
	c.call("GET", "/v1/jobs/twice/workers", "", "", 200, &ws)
	if ws.Target != 0 {
		t.Fatalf("the refused request set the target to %d", ws.Target)
	}
	p = c.problem("POST", "/v1/tokens", "application/json", `{"name": "a\u0000b"}`, 400, string(wire.ReasonBadParameter))
	if !strings.Contains(p.Detail, "control characters") {
		t.Fatalf("a team name with a NUL: %s", p.Detail)
	}

	// A refused creation of "later" (no job has the id) is counted under no job.
	bad := smallSpec("later")
	bad.Ranks = 0
	c.problem("POST", "/v1/jobs", "application/json", specJSON(bad), 400, string(wire.ReasonInvalidSpec))
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := c.counts(gateway.NoJob)[wire.ReasonInvalidSpec] + c.counts("later")[wire.ReasonInvalidSpec]; n != 1 {
			return fmt.Errorf("the refused creation counted %d times", n)
		}
		return nil
	})
	c.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("later")), 201, &created)
	var rj api.Rejects
	c.call("GET", "/v1/jobs/later/rejects", "", "", 200, &rj)
	if len(rj.Counts) != 0 || len(rj.Recent) != 0 {
		t.Fatalf("a new job starts with the rejections of a refused creation under its id: %+v", rj)
	}
}
