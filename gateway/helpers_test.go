package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// authStack starts fanin as `fanin dev` does: NATS in operator mode, every component with its own
// credentials, the API behind the admin token.
func authStack(t testing.TB, runtimes int, opts ...gateway.Option) *devstack.Stack {
	t.Helper()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: runtimes, Logger: testutil.Logger(),
		Auth: true, GatewayOptions: opts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// client calls the API with a token.
type client struct {
	t     testing.TB
	base  string
	token string
}

func (c client) with(token string) client { c.token = token; return c }

// do sends a request and returns the status and the body.
func (c client) do(method, path, ctype, body string) (int, http.Header, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}

// call sends a request, checks its status, and decodes the answer into out (if not nil).
func (c client) call(method, path, ctype, body string, want int, out any) {
	c.t.Helper()
	code, h, data := c.do(method, path, ctype, body)
	if code != want {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, code, data, want)
	}
	if code >= 400 && h.Get("Content-Type") != "application/problem+json" {
		c.t.Fatalf("%s %s: error with Content-Type %q", method, path, h.Get("Content-Type"))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			c.t.Fatalf("%s %s: decode %s: %v", method, path, data, err)
		}
	}
}

// problem sends a request that must fail with status and code.
func (c client) problem(method, path, ctype, body string, status int, code string) api.Problem {
	c.t.Helper()
	var p api.Problem
	c.call(method, path, ctype, body, status, &p)
	if p.Code != code || p.Status != status || p.Detail == "" || p.Type != "urn:fanin:problem:"+code {
		c.t.Fatalf("%s %s: problem %+v, want code %s", method, path, p, code)
	}
	return p
}

// counts returns the rejection counts of a job ("_api" and "_nats" included).
func (c client) counts(jobID string) map[wire.Reason]int64 {
	c.t.Helper()
	var tot api.RejectTotals
	c.call("GET", "/v1/rejects", "", "", 200, &tot)
	return tot.Jobs[jobID]
}

// awaitCount waits until the job's count of reason reaches want.
func (c client) awaitCount(jobID string, reason wire.Reason, want int64) {
	c.t.Helper()
	testutil.CheckFor(c.t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := c.counts(jobID)[reason]; got != want {
			return fmt.Errorf("job %s: %s counted %d times, want %d", jobID, reason, got, want)
		}
		return nil
	})
}

func specJSON(s job.Spec) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// smallSpec: one rank, shards of 4 KiB (w: 2 shards, b: 1).
func smallSpec(id string) job.Spec {
	return job.Spec{
		ID: id, Ranks: 1, ShardSize: 4 << 10,
		Tensors:  []job.Tensor{{Name: "w", Shape: []int{2000}}, {Name: "b", Shape: []int{10}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.5}},
		Init:     job.Init{Kind: "uniform", Seed: 3, Scale: 0.1},
	}
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

// paramsAt waits until every shard's parameters are at step and returns them.
func paramsAt(t testing.TB, js jetstream.JetStream, rec *job.Record, step int64) []float32 {
	t.Helper()
	return testutil.ParamsAt(t, testutil.DirectGetter(js.Conn(), wire.ParamsStream(rec.Spec.ID)), rec, step)
}

// publishStep publishes every rank's gradient of one step (testutil.Gradient of params).
func publishStep(t testing.TB, js jetstream.JetStream, rec *job.Record, params []float32, step int64, grads [][]float32) {
	t.Helper()
	for r := range grads {
		testutil.Gradient(grads[r], params, step, r)
		for _, s := range rec.Layout.Shards {
			m := gradMsg(rec.Spec.ID, s.ID, step, r, f32bytes(grads[r][s.Off:s.Off+s.Len]))
			if _, err := js.PublishMsg(context.Background(), m); err != nil {
				t.Fatalf("publish step %d rank %d shard %d: %v", step, r, s.ID, err)
			}
		}
	}
}

func gradMsg(jobID string, shard int, step int64, rank int, data []byte) *nats.Msg {
	return wire.GradMsg(wire.Grad{Job: jobID, Shard: shard, Step: step, Rank: rank}, data)
}

// natsAs connects with job credentials; errs receives the connection's asynchronous errors.
func natsAs(t testing.TB, url string, c *api.Credentials, errs chan<- error) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.UserJWTAndSeed(c.JWT, c.Seed), nats.CustomInboxPrefix(c.InboxPrefix)}
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// doHeader sends a request with an Authorization header as given.
func (c client) doHeader(method, path, authz string) (int, http.Header, []byte) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+path, nil)
	req.Header.Set("Authorization", authz)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
