package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Admission: every spec that would make fanin store non-finite numbers, more than the platform
// allows, or something other than what it says, is refused with a 4xx and a specific reason; no
// job is created.
func TestAdmissionRefusals(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1, gateway.WithMaxModelBytes(1<<20))
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	spec := func(edit func(*job.Spec)) string {
		s := smallSpec("adm")
		edit(&s)
		return specJSON(s)
	}
	base := specJSON(smallSpec("adm"))
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		code              wire.Reason
		detail            string
	}{
		{"empty body", "application/json", "", 400, wire.ReasonInvalidSpec, "empty"},
		{"blank YAML body", "application/yaml", "\n\n", 400, wire.ReasonInvalidSpec, "empty"},
		{"trailing JSON", "application/json", base + `{"id":"x"}`, 400, wire.ReasonInvalidSpec, "trailing data"},
		{"a second YAML document", "application/yaml", "id: adm\n---\nid: other\n", 400, wire.ReasonInvalidSpec, "one YAML document only"},
		{"duplicate key", "application/json", strings.Replace(base, `"ranks":1`, `"ranks":1,"ranks":2`, 1), 400, wire.ReasonInvalidSpec, `"ranks" is given twice`},
		{"overflowing learning rate", "application/json", spec(func(s *job.Spec) { s.Function.Hyper["lr"] = 1e300 }), 400, wire.ReasonBadHyper, "float32"},
		{"non-finite initial parameters", "application/json", spec(func(s *job.Spec) { s.Init.Scale = 1e39 }), 400, wire.ReasonInvalidSpec, "init.scale"},
		{"more replicas than servers", "application/json", spec(func(s *job.Spec) { s.Replicas = 3 }), 400, wire.ReasonInvalidSpec, "replicas"},
		{"model over the platform's maximum", "application/json", spec(func(s *job.Spec) { s.Tensors = []job.Tensor{{Name: "w", Shape: []int{1 << 19}}} }), 400, wire.ReasonInvalidSpec, "accepts at most 1 MiB per job"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := c.problem("POST", "/v1/jobs", tc.ctype, tc.body, tc.status, string(tc.code))
			if !strings.Contains(p.Detail, tc.detail) {
				t.Fatalf("detail %q, want it to say %q", p.Detail, tc.detail)
			}
		})
	}
	var list api.JobList
	c.call("GET", "/v1/jobs", "", "", 200, &list)
	if len(list.Jobs) != 0 {
		t.Fatalf("a refused spec made a job: %+v", list.Jobs)
	}

	// A team's storage quota: the sum of its jobs' storage bounds.
	one := smallSpec("s1")
	rec := job.NewRecord(one, time.Now())
	grad, params := store.JobStorageBound(&rec)
	var team api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", fmt.Sprintf(`{"name":"st","quota":{"storage_bytes":%d}}`, 2*(grad+params)+1), 201, &team)
	tc := c.with(team.Token)
	tc.call("POST", "/v1/jobs", "application/json", specJSON(one), 201, nil)
	tc.call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("s2")), 201, nil)
	p := tc.problem("POST", "/v1/jobs", "application/json", specJSON(smallSpec("s3")), 429, string(wire.ReasonQuotaExceeded))
	if !strings.Contains(p.Detail, "may store") {
		t.Fatalf("storage quota: %s", p.Detail)
	}
}
