package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Admin is a client of the gateway's HTTP API (docs/API.md).
type Admin struct {
	base  string
	token string
	hc    *http.Client
}

// AdminOption configures an Admin.
type AdminOption func(*Admin)

// WithToken sends a bearer token with every request: the admin token, a team token, or a job
// token.
func WithToken(token string) AdminOption { return func(a *Admin) { a.token = token } }

// WithHTTPClient replaces the default HTTP client (30s timeout).
func WithHTTPClient(hc *http.Client) AdminOption { return func(a *Admin) { a.hc = hc } }

// NewAdmin returns a client of the gateway at base, e.g. "http://127.0.0.1:8080". Options:
// WithToken, WithHTTPClient.
func NewAdmin(base string, opts ...AdminOption) *Admin {
	a := &Admin{base: strings.TrimRight(base, "/"), hc: &http.Client{Timeout: 30 * time.Second}}
	for _, o := range opts {
		o(a)
	}
	return a
}

// APIError is an error answer of the gateway (an RFC 9457 problem document). For rejected
// inputs, Code is a wire.Reason: errors.Is(err, wire.ErrReason(wire.ReasonQuotaExceeded)) holds.
type APIError struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("gateway: %d %s: %s", e.Status, e.Code, e.Detail)
}

// Reason is the error's code as a rejection reason ("" when the code is not one).
func (e *APIError) Reason() wire.Reason {
	if r := wire.Reason(e.Code); wire.KnownReason(r) {
		return r
	}
	return ""
}

// Is matches wire.ErrReason targets by code.
func (e *APIError) Is(target error) bool {
	t, ok := target.(*wire.Reject)
	return ok && t.Detail == "" && string(t.Reason) == e.Code
}

// IsNotFound reports whether err is the gateway's 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// IsForbidden reports whether err is the gateway's 403: the token does not reach the route.
func IsForbidden(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusForbidden
}

// CreateJob submits a spec and returns the stored record with its layout.
func (a *Admin) CreateJob(ctx context.Context, spec job.Spec) (*job.Record, error) {
	c, err := a.SubmitJob(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &c.Record, nil
}

// CreateJobRaw submits a spec as JSON or YAML bytes, as read from a file.
func (a *Admin) CreateJobRaw(ctx context.Context, spec []byte) (*job.Record, error) {
	c, err := a.SubmitJobRaw(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &c.Record, nil
}

// SubmitJob creates a job and returns everything the gateway answers: the record, the job's token
// and its workers' NATS credentials (see WithJobCredentials), which are shown only this once.
func (a *Admin) SubmitJob(ctx context.Context, spec job.Spec) (*api.JobCreated, error) {
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var c api.JobCreated
	return &c, a.do(ctx, http.MethodPost, "/v1/jobs", "application/json", body, &c)
}

// SubmitJobRaw is SubmitJob for a spec as JSON or YAML bytes.
func (a *Admin) SubmitJobRaw(ctx context.Context, spec []byte) (*api.JobCreated, error) {
	var c api.JobCreated
	return &c, a.do(ctx, http.MethodPost, "/v1/jobs", "application/yaml", spec, &c)
}

// Job returns one job's record.
func (a *Admin) Job(ctx context.Context, id string) (*job.Record, error) {
	st, err := a.JobStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	return &st.Record, nil
}

// JobStatus returns one job's record and status, per shard.
func (a *Admin) JobStatus(ctx context.Context, id string) (*api.JobStatus, error) {
	var st api.JobStatus
	return &st, a.do(ctx, http.MethodGet, jobPath(id, ""), "", nil, &st)
}

// Jobs lists every job the token reaches.
func (a *Admin) Jobs(ctx context.Context) ([]job.Record, error) {
	sts, err := a.JobStatuses(ctx)
	if err != nil {
		return nil, err
	}
	recs := make([]job.Record, len(sts))
	for i, st := range sts {
		recs[i] = st.Record
	}
	return recs, nil
}

// JobStatuses lists every job the token reaches with its status (not per shard).
func (a *Admin) JobStatuses(ctx context.Context) ([]api.JobStatus, error) {
	var out api.JobList
	return out.Jobs, a.do(ctx, http.MethodGet, "/v1/jobs", "", nil, &out)
}

// DeleteJob drains a job and deletes it with its streams, state and credentials.
func (a *Admin) DeleteJob(ctx context.Context, id string) error {
	return a.do(ctx, http.MethodDelete, jobPath(id, ""), "", nil, nil)
}

// PauseJob takes a job off the runtimes; its workers' gradients queue until ResumeJob.
func (a *Admin) PauseJob(ctx context.Context, id string) (*api.JobStatus, error) {
	var st api.JobStatus
	return &st, a.do(ctx, http.MethodPost, jobPath(id, "/pause"), "", nil, &st)
}

// ResumeJob places a paused job again.
func (a *Admin) ResumeJob(ctx context.Context, id string) (*api.JobStatus, error) {
	var st api.JobStatus
	return &st, a.do(ctx, http.MethodPost, jobPath(id, "/resume"), "", nil, &st)
}

// Workers returns a job's elastic workers: the logical ranks each holds, its step and last beat,
// which stand by, and the assignment's epoch and the job's target worker count. A job none of
// whose elastic workers ever beat lists none.
func (a *Admin) Workers(ctx context.Context, id string) (*api.JobWorkers, error) {
	var ws api.JobWorkers
	return &ws, a.do(ctx, http.MethodGet, jobPath(id, "/workers"), "", nil, &ws)
}

// SetWorkers sets a job's target worker count: 0, every live elastic worker holds ranks; n (at most
// the job's ranks), the first n workers to join do and the others stand by. The answer has the new
// target and the workers as last assigned; the autoscaler reassigns the ranks within a second. A
// target out of range is an *APIError with reason wire.ReasonBadParameter.
func (a *Admin) SetWorkers(ctx context.Context, id string, n int) (*api.JobWorkers, error) {
	body, _ := json.Marshal(api.WorkersRequest{Target: &n})
	var ws api.JobWorkers
	return &ws, a.do(ctx, http.MethodPut, jobPath(id, "/workers"), "application/json", body, &ws)
}

// Shards returns a job's shards: placement, step, lag.
func (a *Admin) Shards(ctx context.Context, id string) ([]api.ShardStatus, error) {
	var out struct {
		Shards []api.ShardStatus `json:"shards"`
	}
	return out.Shards, a.do(ctx, http.MethodGet, jobPath(id, "/shards"), "", nil, &out)
}

// Rejects returns a job's rejection counts by reason and its latest limit rejections (0: the
// gateway's default).
func (a *Admin) Rejects(ctx context.Context, id string, limit int) (*api.Rejects, error) {
	path := jobPath(id, "/rejects")
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	var out api.Rejects
	return &out, a.do(ctx, http.MethodGet, path, "", nil, &out)
}

// RejectTotals returns the rejection counts of every job (admin).
func (a *Admin) RejectTotals(ctx context.Context) (*api.RejectTotals, error) {
	var out api.RejectTotals
	return &out, a.do(ctx, http.MethodGet, "/v1/rejects", "", nil, &out)
}

// NewCredentials issues another set of NATS credentials for a job's workers.
func (a *Admin) NewCredentials(ctx context.Context, id string) (*api.Credentials, error) {
	var c api.Credentials
	return &c, a.do(ctx, http.MethodPost, jobPath(id, "/credentials"), "", nil, &c)
}

// Pool returns the runtimes with their load (admin).
func (a *Admin) Pool(ctx context.Context) (*api.Pool, error) {
	var p api.Pool
	return &p, a.do(ctx, http.MethodGet, "/v1/runtimes", "", nil, &p)
}

// Runtime returns one runtime (admin).
func (a *Admin) Runtime(ctx context.Context, id string) (*api.RuntimeStatus, error) {
	var rs api.RuntimeStatus
	return &rs, a.do(ctx, http.MethodGet, "/v1/runtimes/"+url.PathEscape(id), "", nil, &rs)
}

// Placement returns every shard's placement (admin).
func (a *Admin) Placement(ctx context.Context) ([]api.Placement, error) {
	var out struct {
		Placement []api.Placement `json:"placement"`
	}
	return out.Placement, a.do(ctx, http.MethodGet, "/v1/placement", "", nil, &out)
}

// Policy returns the autoscaler policy in force (admin).
func (a *Admin) Policy(ctx context.Context) (*api.PolicyDoc, error) {
	var d api.PolicyDoc
	return &d, a.do(ctx, http.MethodGet, "/v1/policy", "", nil, &d)
}

// SetPolicy replaces the autoscaler policy with a YAML or JSON document (admin); the autoscaler
// follows it at once.
func (a *Admin) SetPolicy(ctx context.Context, doc []byte) (*api.PolicyDoc, error) {
	var d api.PolicyDoc
	return &d, a.do(ctx, http.MethodPut, "/v1/policy", "application/yaml", doc, &d)
}

// PolicyHistory lists the stored revisions of the policy, oldest first (admin).
func (a *Admin) PolicyHistory(ctx context.Context) ([]api.PolicyRevision, error) {
	var out struct {
		History []api.PolicyRevision `json:"history"`
	}
	return out.History, a.do(ctx, http.MethodGet, "/v1/policy/history", "", nil, &out)
}

// Decisions returns the autoscaler's latest limit decisions, oldest first (admin).
func (a *Admin) Decisions(ctx context.Context, limit int) ([]api.Decision, error) {
	var out struct {
		Decisions []api.Decision `json:"decisions"`
	}
	return out.Decisions, a.do(ctx, http.MethodGet, "/v1/decisions?limit="+strconv.Itoa(max(1, limit)), "", nil, &out)
}

// Functions lists the aggregation functions with their hyper-parameters.
func (a *Admin) Functions(ctx context.Context) ([]functions.FuncInfo, error) {
	var out struct {
		Functions []functions.FuncInfo `json:"functions"`
	}
	return out.Functions, a.do(ctx, http.MethodGet, "/v1/functions", "", nil, &out)
}

// CreateTeam issues a team token with a quota (admin). The token is in the answer only.
func (a *Admin) CreateTeam(ctx context.Context, name string, q api.Quota) (*api.TeamCreated, error) {
	body, _ := json.Marshal(api.TeamRequest{Name: name, Quota: q})
	var t api.TeamCreated
	return &t, a.do(ctx, http.MethodPost, "/v1/tokens", "application/json", body, &t)
}

// Teams lists the team tokens (admin).
func (a *Admin) Teams(ctx context.Context) ([]api.Team, error) {
	var out struct {
		Tokens []api.Team `json:"tokens"`
	}
	return out.Tokens, a.do(ctx, http.MethodGet, "/v1/tokens", "", nil, &out)
}

// DeleteTeam revokes a team token (admin).
func (a *Admin) DeleteTeam(ctx context.Context, id string) error {
	return a.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), "", nil, nil)
}

// Whoami says what the client's token is.
func (a *Admin) Whoami(ctx context.Context) (*api.Whoami, error) {
	var w api.Whoami
	return &w, a.do(ctx, http.MethodGet, "/v1/whoami", "", nil, &w)
}

func jobPath(id, sub string) string { return "/v1/jobs/" + url.PathEscape(id) + sub }

func (a *Admin) do(ctx context.Context, method, path, ctype string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Code == "" {
			ae.Code, ae.Detail = http.StatusText(resp.StatusCode), strings.TrimSpace(string(data))
		}
		return ae
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
