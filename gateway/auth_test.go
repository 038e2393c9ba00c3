package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fanin-ml/fanin/dashboard"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// Unauthenticated calls get 401 (not recorded: TestDashboardStateByToken), calls beyond a
// token's scope 403, quotas 429; each refusal is counted under the job it concerns. A job's NATS credentials reach its own subjects only: the
// server denies publishing to another job's gradients and reading its parameters, and refuses a
// JWT presented with the wrong seed.
func TestAuthScopes(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}

	for _, h := range []string{"", "Bearer", "Bearer wrong-token", "Basic " + st.AdminToken} {
		anon := c.with("")
		code, hdr, _ := anon.doAuth("GET", "/v1/jobs", h)
		if code != 401 || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("Authorization %q: %d, want 401 with WWW-Authenticate", h, code)
		}
	}
	c.with("").problem("GET", "/v1/runtimes", "", "", 401, string(wire.ReasonUnauthorized))

	var teamA, teamB api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", `{"name":"a","quota":{"jobs":2,"shards":3}}`, 201, &teamA)
	c.call("POST", "/v1/tokens", "application/json", `{"name":"b"}`, 201, &teamB)
	a, b := c.with(teamA.Token), c.with(teamB.Token)
	var who api.Whoami
	a.call("GET", "/v1/whoami", "", "", 200, &who)
	if who.Kind != "team" || who.Team != teamA.ID {
		t.Fatalf("whoami: %+v", who)
	}

	var a1, a2, b1 api.JobCreated
	a.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("a1")), 201, &a1)
	big := smallSpec("a-big")
	big.Tensors[0].Shape = []int{5000}
	p := a.problem("POST", "/v1/jobs", "application/json", specJSON(big), 429, string(wire.ReasonQuotaExceeded))
	if !strings.Contains(p.Detail, "6 shards, the quota allows 3") {
		t.Fatalf("shards quota: %s", p.Detail)
	}
	a.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("a2")), 201, &a2)
	p = a.problem("POST", "/v1/jobs", "application/json", specJSON(smallSpec("a3")), 429, string(wire.ReasonQuotaExceeded))
	if !strings.Contains(p.Detail, "owns 2 jobs, the quota allows 2") {
		t.Fatalf("jobs quota: %s", p.Detail)
	}
	b.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("b1")), 201, &b1)
	// Priority high is the admin's to give: a team may create normal and low jobs only.
	hi := smallSpec("a-hi")
	hi.Priority = job.PriorityHigh
	p = a.problem("POST", "/v1/jobs", "application/json", specJSON(hi), 403, string(wire.ReasonForbidden))
	if !strings.Contains(p.Detail, "only an admin token may create a job of priority high") {
		t.Fatalf("high priority by a team: %s", p.Detail)
	}
	var hiRec api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(hi), 201, &hiRec)
	if hiRec.Record.Spec.Priority != job.PriorityHigh {
		t.Fatalf("admin's high job stored as %+v", hiRec.Record.Spec)
	}
	// Refused creations are counted under no job: none had the id (a-hi is created after).
	c.awaitCount(gateway.NoJob, wire.ReasonQuotaExceeded, 2)

	// Team a sees and reaches its jobs only, and no admin route.
	var list api.JobList
	a.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 2 || list.Jobs[0].Spec.ID != "a1" || list.Jobs[1].Spec.ID != "a2" || list.Jobs[0].Owner != teamA.ID {
		t.Fatalf("team a lists %+v", list.Jobs)
	}
	a.call("GET", "/v1/jobs/a2", "", "", 200, nil)
	a.problem("GET", "/v1/jobs/b1", "", "", 403, string(wire.ReasonForbidden))
	a.problem("GET", "/v1/jobs/b1/rejects", "", "", 403, string(wire.ReasonForbidden))
	for _, r := range [][2]string{{"GET", "/v1/runtimes"}, {"GET", "/v1/placement"}, {"GET", "/v1/policy"}, {"PUT", "/v1/policy"},
		{"GET", "/v1/decisions"}, {"GET", "/v1/tokens"}, {"POST", "/v1/tokens"}, {"GET", "/v1/rejects"}} {
		a.problem(r[0], r[1], "", "", 403, string(wire.ReasonForbidden))
	}
	a.call("GET", "/v1/functions", "", "", 200, nil)

	// A job token reaches its job only, and creates nothing.
	j := c.with(a1.Token)
	j.call("GET", "/v1/whoami", "", "", 200, &who)
	if who.Kind != "job" || who.Job != "a1" {
		t.Fatalf("whoami: %+v", who)
	}
	j.call("GET", "/v1/jobs/a1", "", "", 200, nil)
	j.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].Spec.ID != "a1" {
		t.Fatalf("job token lists %+v", list.Jobs)
	}
	j.problem("GET", "/v1/jobs/a2", "", "", 403, string(wire.ReasonForbidden))
	j.problem("POST", "/v1/jobs", "application/json", specJSON(smallSpec("a4")), 403, string(wire.ReasonForbidden))
	// Refusals are recorded under no job, never against the job a caller could not reach.
	c.awaitCount(gateway.NoJob, wire.ReasonForbidden, 1+2+8+2)
	for _, id := range []string{"b1", "a2"} {
		if n := c.counts(id)[wire.ReasonForbidden]; n != 0 {
			t.Fatalf("job %s: %d forbidden API calls recorded against it", id, n)
		}
	}

	// NATS: job a1's credentials against job b1.
	errs := make(chan error, 16)
	ncA := natsAs(t, st.URL, a1.Credentials, errs)
	jsA, _ := jetstream.New(ncA)
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := jsA.PublishMsg(short, gradMsg("b1", 0, 1, 0, make([]byte, 4*1000))); err == nil {
		t.Fatal("job a1's credentials published to job b1's gradients")
	}
	waitErr(t, errs, `Publish to "fanin.v1.b1.grad.0"`)
	if _, err := ncA.SubscribeSync(wire.ParamsWildcard("b1")); err != nil {
		t.Fatal(err)
	}
	waitErr(t, errs, `Subscription to "fanin.v1.b1.params.*"`)
	short2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if ps, err := jsA.Stream(short2, wire.ParamsStream("b1")); err == nil {
		t.Fatalf("job a1 opened job b1's parameter stream: %v", ps.CachedInfo().Config.Name)
	}
	if _, err := ncA.Request("$JS.API.DIRECT.GET."+wire.ParamsStream("b1")+"."+wire.ParamsSubject("b1", 0), nil, 500*time.Millisecond); err == nil {
		t.Fatal("job a1 read job b1's parameters")
	}
	c.awaitCount("a1", wire.ReasonForbidden, 4)
	// Its own: allowed.
	psA := testutil.DirectGetter(ncA, wire.ParamsStream("a1"))
	if _, err := psA.GetLastMsgForSubject(context.Background(), wire.ParamsSubject("a1", 0)); err != nil {
		t.Fatalf("job a1 reading its own parameters: %v", err)
	}

	// The right JWT with the wrong seed: the server refuses it, counted under the job.
	kp, _ := nkeys.CreateUser()
	wrongSeed, _ := kp.Seed()
	if nc, err := nats.Connect(st.URL, nats.UserJWTAndSeed(a1.Credentials.JWT, string(wrongSeed))); err == nil {
		nc.Close()
		t.Fatal("connected with a stolen JWT and the wrong seed")
	}
	c.awaitCount("a1", wire.ReasonUnauthorized, 1)
	var rj api.Rejects
	c.call("GET", "/v1/jobs/a1/rejects", "", "", 200, &rj)
	if rj.Counts[wire.ReasonForbidden] != 4 || rj.Counts[wire.ReasonUnauthorized] != 1 || len(rj.Recent) != 5 {
		t.Fatalf("rejects of a1: %+v", rj)
	}
	for _, r := range rj.Recent {
		if r.Source != "nats" || r.At.IsZero() || r.Job != "a1" {
			t.Fatalf("reject record %+v", r)
		}
	}
	// A user JWT of the job, decoded, names its permissions: nothing beyond its job.
	uc, err := jwt.DecodeUserClaims(a1.Credentials.JWT)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(uc.Pub.Allow, uc.Sub.Allow...) {
		if !strings.Contains(s, "a1") && s != "_INBOX.>" { // _INBOX is private to the job's own account
			t.Errorf("job a1's credentials allow %q", s)
		}
	}

	// The job's owner deletes it with the job token.
	j.call("DELETE", "/v1/jobs/a1", "", "", 204, nil)
	a.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("a3")), 201, nil) // the quota has room again
}

func (c client) doAuth(method, path, authz string) (int, http.Header, []byte) {
	c.t.Helper()
	cc := c
	cc.token = ""
	if authz == "" {
		return cc.do(method, path, "", "")
	}
	code, h, data := cc.doHeader(method, path, authz)
	return code, h, data
}

func waitErr(t *testing.T, errs <-chan error, substr string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if strings.Contains(err.Error(), substr) && errors.Is(err, nats.ErrPermissionViolation) {
				return
			}
		case <-deadline:
			t.Fatalf("the server did not deny %s", substr)
		}
	}
}

// No secret reaches the logs: not the admin token, nor a job's token, JWT or seed.
func TestSecretsNotLogged(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: 1, Logger: log, Auth: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var created api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("s")), 201, &created)
	var more api.Credentials
	c.call("POST", "/v1/jobs/s/credentials", "", "", 201, &more)
	c.with(created.Token+"x").problem("GET", "/v1/jobs/s", "", "", 401, string(wire.ReasonUnauthorized))
	c.call("DELETE", "/v1/jobs/s", "", "", 204, nil)
	st.Close()
	mu.Lock()
	logs := buf.String()
	mu.Unlock()
	if !strings.Contains(logs, "job created") {
		t.Fatal("nothing was logged: the test would prove nothing")
	}
	for name, secret := range map[string]string{
		"admin token": st.AdminToken, "job token": created.Token, "seed": created.Credentials.Seed,
		"JWT": created.Credentials.JWT, "second seed": more.Seed,
	} {
		if strings.Contains(logs, secret) {
			t.Errorf("the %s is in the logs", name)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The dashboard's state shows anyone the public view only (ids, progress, counts: no function,
// ranks, workers or rejection details); a team token sees its own jobs in full and no other's;
// a bad token is refused with a 401 that is not recorded among the rejections.
func TestDashboardStateByToken(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var teamA, teamB api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", `{"name":"a"}`, 201, &teamA)
	c.call("POST", "/v1/tokens", "application/json", `{"name":"b"}`, 201, &teamB)
	c.with(teamA.Token).call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("ta")), 201, nil)
	c.with(teamB.Token).call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("tb")), 201, nil)
	for _, id := range []string{"ta", "tb"} { // one rejection each, with its detail
		c.problem("PUT", "/v1/jobs/"+id+"/workers", "application/json", `{"target": 99}`, 400, string(wire.ReasonBadParameter))
	}
	var full dashboard.State
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		c.call("GET", "/dashboard/api/state", "", "", 200, &full)
		if len(full.Jobs) != 2 || len(full.Rejects) != 2 {
			return fmt.Errorf("the admin's view: %d jobs, %d rejections", len(full.Jobs), len(full.Rejects))
		}
		return nil
	})

	_, _, raw := c.with("").do("GET", "/dashboard/api/state", "", "")
	var anon dashboard.State
	if err := jsonUnmarshal(raw, &anon); err != nil {
		t.Fatal(err)
	}
	if !anon.Anonymous || len(anon.Jobs) != 2 || len(anon.Rejects) != 0 || len(anon.Counts) != 0 {
		t.Fatalf("the public view: %s", raw)
	}
	for _, j := range anon.Jobs {
		if j.Function != "" || j.Ranks != 0 || j.Bytes != 0 || len(j.Workers) != 0 || j.Rejects != 1 {
			t.Fatalf("the public view of job %s: %+v", j.ID, j)
		}
	}
	for _, leak := range []string{"sgd", "target 99", `"ranks"`, `"function"`, `"detail"`} {
		if strings.Contains(string(raw), leak) {
			t.Fatalf("the public view shows %s: %s", leak, raw)
		}
	}

	var mine dashboard.State
	c.with(teamA.Token).call("GET", "/dashboard/api/state", "", "", 200, &mine)
	if len(mine.Jobs) != 1 || mine.Jobs[0].ID != "ta" || mine.Jobs[0].Function != "sgd" ||
		len(mine.Rejects) != 1 || mine.Rejects[0].Job != "ta" || !strings.Contains(mine.Rejects[0].Detail, "target 99") {
		t.Fatalf("team a's view: %+v", mine)
	}
	for _, rt := range mine.Runtimes {
		for _, sh := range rt.Shards {
			if sh.Job != "ta" {
				t.Fatalf("team a's view shows a shard of %s", sh.Job)
			}
		}
	}

	// Bad credentials: 401, not recorded. A forbidden call after them is, and the counter takes
	// the rejections in order: once it is counted, a recorded 401 would have been too.
	code, _, _ := c.doHeader("GET", "/dashboard/api/state", "Bearer not-a-token")
	if code != 401 {
		t.Fatalf("a bad token on the dashboard's state: %d", code)
	}
	c.with("").problem("GET", "/v1/jobs", "", "", 401, string(wire.ReasonUnauthorized))
	c.with(teamB.Token).problem("GET", "/v1/jobs/ta", "", "", 403, string(wire.ReasonForbidden))
	c.awaitCount(gateway.NoJob, wire.ReasonForbidden, 1)
	if n := c.counts(gateway.NoJob)[wire.ReasonUnauthorized]; n != 0 {
		t.Fatalf("%d anonymous 401s recorded", n)
	}
}
