package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
)

const tinyYAML = `
id: tiny
tensors: [{name: w, shape: [4]}]
ranks: 2
function: {name: sgd, hyper: {lr: 0.5}}
shard_size: 4KiB
`

func call(t *testing.T, method, url, ctype, body string) (int, string, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	return resp.StatusCode, resp.Header.Get("Content-Type"), m
}

func TestJobsAPI(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	base := st.HTTPURL

	code, _, body := call(t, "POST", base+"/v1/jobs", "application/yaml", tinyYAML)
	if code != http.StatusCreated || body["layout"] == nil {
		t.Fatalf("create: %d %v", code, body)
	}
	if code, _, body = call(t, "POST", base+"/v1/jobs", "application/yaml", tinyYAML); code != http.StatusConflict || body["code"] != "job_exists" {
		t.Fatalf("create twice: %d %v", code, body)
	}
	if code, _, body = call(t, "GET", base+"/v1/jobs/tiny", "", ""); code != http.StatusOK {
		t.Fatalf("get: %d %v", code, body)
	}
	var rec job.Record
	raw, _ := json.Marshal(body)
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Spec.Ranks != 2 || rec.Layout.Elements != 4 {
		t.Fatalf("get returned %+v (%v)", rec, err)
	}
	if code, _, body = call(t, "GET", base+"/v1/jobs", "", ""); code != http.StatusOK || len(body["jobs"].([]any)) != 1 {
		t.Fatalf("list: %d %v", code, body)
	}
	// Without a NATS authority there are no credentials to issue, for a job or for none.
	for _, id := range []string{"tiny", "nope"} {
		if code, _, body = call(t, "POST", base+"/v1/jobs/"+id+"/credentials", "", ""); code != http.StatusNotImplemented || body["code"] != "credentials_disabled" {
			t.Fatalf("credentials of %s without an authority: %d %v", id, code, body)
		}
	}
	if code, _, _ = call(t, "DELETE", base+"/v1/jobs/tiny", "", ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	if code, _, body = call(t, "GET", base+"/v1/jobs/tiny", "", ""); code != http.StatusNotFound || body["code"] != "job_not_found" {
		t.Fatalf("get after delete: %d %v", code, body)
	}
	if code, _, _ = call(t, "DELETE", base+"/v1/jobs/tiny", "", ""); code != http.StatusNotFound {
		t.Fatalf("delete twice: %d", code)
	}
	if code, _, body = call(t, "POST", base+"/v1/jobs", "application/yaml", tinyYAML); code != http.StatusCreated {
		t.Fatalf("re-create after delete: %d %v", code, body)
	}
}

func TestJobsAPIErrors(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	base := st.HTTPURL
	cases := []struct {
		name, ctype, body string
		status            int
		code, detail      string
	}{
		{"bad shard size", "application/yaml", strings.Replace(tinyYAML, "4KiB", "1KiB", 1), 400, "invalid_spec", "shard_size: must be 4 KiB..8 MiB"},
		{"unknown function", "application/yaml", strings.Replace(tinyYAML, "sgd", "lbfgs", 1), 400, "unknown_function", `unknown function "lbfgs"`},
		{"unknown field", "application/json", `{"id":"x","colour":1}`, 400, "invalid_spec", "colour"},
		{"f16 parameters", "application/yaml", tinyYAML + "param_dtype: f16\n", 400, "invalid_spec", "param_dtype: f16 is not offered for parameters: a parameter beyond ±65504 would become Inf"},
		{"gradient streams beyond shards", "application/yaml", tinyYAML + "gradient_streams: 2\n", 400, "invalid_spec", "gradient_streams: 2 streams for 1 shards: at most one stream per shard"},
		{"gradient streams direct", "application/yaml", tinyYAML + "gradients: direct\ngradient_streams: 2\n", 400, "invalid_spec", "gradient_streams: a job with gradients: direct has no gradient stream"},
		{"not yaml", "application/yaml", "id: [", 400, "invalid_spec", "not JSON or YAML"},
		{"content type", "text/plain", tinyYAML, 415, "unsupported_media_type", "text/plain"},
		{"too many shards", "application/json", `{"id":"x","ranks":1,"function":{"name":"sum"},"tensors":[{"name":"w","shape":[4294967296]}],"shard_size":4096}`, 400, "invalid_spec", "more than 1048576"},
		{"too deep", "application/json", `{"id":"x","tensors":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, 400, "too_deep", "nested 101 levels"},
		{"too large", "application/json", `{"id":"` + strings.Repeat("x", gateway.MaxSpecBytes) + `"}`, 413, "body_too_large", "at most"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, ctype, body := call(t, "POST", base+"/v1/jobs", c.ctype, c.body)
			if code != c.status || body["code"] != c.code || !strings.Contains(body["detail"].(string), c.detail) {
				t.Fatalf("got %d %v, want %d %s containing %q", code, body, c.status, c.code, c.detail)
			}
			if ctype != "application/problem+json" {
				t.Fatalf("Content-Type %q, want application/problem+json", ctype)
			}
		})
	}
	if code, _, body := call(t, "GET", base+"/healthz", "", ""); code != 200 || body["status"] != "ok" {
		t.Fatalf("healthz: %d %v", code, body)
	}
}
