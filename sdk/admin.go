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
	"strings"
	"time"

	"github.com/fanin-ml/fanin/job"
)

// Admin is a client of the gateway's HTTP API.
type Admin struct {
	base  string
	token string
	hc    *http.Client
}

// AdminOption configures an Admin.
type AdminOption func(*Admin)

// WithToken sends a bearer token with every request.
func WithToken(token string) AdminOption { return func(a *Admin) { a.token = token } }

// WithHTTPClient replaces the default HTTP client (30s timeout).
func WithHTTPClient(hc *http.Client) AdminOption { return func(a *Admin) { a.hc = hc } }

// NewAdmin returns a client of the gateway at base, e.g. "http://127.0.0.1:8080".
func NewAdmin(base string, opts ...AdminOption) *Admin {
	a := &Admin{base: strings.TrimRight(base, "/"), hc: &http.Client{Timeout: 30 * time.Second}}
	for _, o := range opts {
		o(a)
	}
	return a
}

// APIError is an error answer of the gateway (an RFC 9457 problem document).
type APIError struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("gateway: %d %s: %s", e.Status, e.Code, e.Detail)
}

// CreateJob submits a spec and returns the stored record with its layout.
func (a *Admin) CreateJob(ctx context.Context, spec job.Spec) (*job.Record, error) {
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var rec job.Record
	return &rec, a.do(ctx, http.MethodPost, "/v1/jobs", "application/json", body, &rec)
}

// CreateJobRaw submits a spec as JSON or YAML bytes, as read from a file.
func (a *Admin) CreateJobRaw(ctx context.Context, spec []byte) (*job.Record, error) {
	var rec job.Record
	return &rec, a.do(ctx, http.MethodPost, "/v1/jobs", "application/yaml", spec, &rec)
}

// Job returns one job's record.
func (a *Admin) Job(ctx context.Context, id string) (*job.Record, error) {
	var rec job.Record
	return &rec, a.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), "", nil, &rec)
}

// Jobs lists every job.
func (a *Admin) Jobs(ctx context.Context) ([]job.Record, error) {
	var out struct {
		Jobs []job.Record `json:"jobs"`
	}
	return out.Jobs, a.do(ctx, http.MethodGet, "/v1/jobs", "", nil, &out)
}

// DeleteJob deletes a job, its streams and its state.
func (a *Admin) DeleteJob(ctx context.Context, id string) error {
	return a.do(ctx, http.MethodDelete, "/v1/jobs/"+url.PathEscape(id), "", nil, nil)
}

// IsNotFound reports whether err is the gateway's 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

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
