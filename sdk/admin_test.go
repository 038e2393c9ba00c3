package sdk_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The gateway's problem documents become *sdk.APIError; rejection codes match wire reasons with
// errors.Is, and the bearer token is sent.
func TestAdminErrors(t *testing.T) {
	t.Parallel()
	var gotAuth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/problem+json")
		switch r.URL.Path {
		case "/v1/jobs":
			w.WriteHeader(429)
			_, _ = w.Write([]byte(`{"type":"urn:fanin:problem:quota_exceeded","title":"Too Many Requests","status":429,"detail":"owns 2 jobs","code":"quota_exceeded"}`))
		case "/v1/runtimes":
			w.WriteHeader(403)
			_, _ = w.Write([]byte(`{"status":403,"code":"forbidden","detail":"only the admin token may"}`))
		default:
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"status":404,"code":"job_not_found","detail":"job \"x\": job not found"}`))
		}
	}))
	defer srv.Close()
	a := sdk.NewAdmin(srv.URL, sdk.WithToken("fanin_team_abc"))
	ctx := context.Background()

	_, err := a.JobStatuses(ctx)
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.Status != 429 || ae.Reason() != wire.ReasonQuotaExceeded {
		t.Fatalf("got %v", err)
	}
	if !errors.Is(err, wire.ErrReason(wire.ReasonQuotaExceeded)) || errors.Is(err, wire.ErrReason(wire.ReasonForbidden)) {
		t.Fatal("errors.Is by reason does not work on API errors")
	}
	if gotAuth != "Bearer fanin_team_abc" {
		t.Fatalf("Authorization %q", gotAuth)
	}
	if _, err := a.Pool(ctx); !sdk.IsForbidden(err) || sdk.IsNotFound(err) {
		t.Fatalf("pool: %v", err)
	}
	_, err = a.JobStatus(ctx, "x")
	if !sdk.IsNotFound(err) || !errors.As(err, &ae) || ae.Reason() != "" {
		t.Fatalf("job: %v", err)
	}
}

// Admin.Workers and SetWorkers against a gateway: an empty list before any elastic worker beat,
// the target set and validated.
func TestAdminWorkers(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	a := sdk.NewAdmin(st.HTTPURL)
	ctx := context.Background()
	if _, err := a.CreateJob(ctx, job.Spec{ID: "el", Ranks: 3, Tensors: []job.Tensor{{Name: "w", Shape: []int{8}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}}); err != nil {
		t.Fatal(err)
	}
	ws, err := a.Workers(ctx, "el")
	if err != nil || ws.Job != "el" || ws.Ranks != 3 || ws.Target != 0 || ws.Workers == nil || len(ws.Workers) != 0 {
		t.Fatalf("workers: %+v %v", ws, err)
	}
	if ws, err = a.SetWorkers(ctx, "el", 2); err != nil || ws.Target != 2 {
		t.Fatalf("set workers 2: %+v %v", ws, err)
	}
	if rec, err := a.Job(ctx, "el"); err != nil || rec.Workers != 2 {
		t.Fatalf("the record after set workers 2: %+v %v", rec, err)
	}
	if _, err := a.SetWorkers(ctx, "el", 4); !errors.Is(err, wire.ErrReason(wire.ReasonBadParameter)) {
		t.Fatalf("set workers 4 of 3 ranks: %v", err)
	}
	if _, err := a.Workers(ctx, "nope"); !sdk.IsNotFound(err) {
		t.Fatalf("workers of an unknown job: %v", err)
	}
}
