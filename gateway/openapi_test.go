package gateway_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/lab/testutil"
)

// The OpenAPI document describes exactly the registered routes, both ways, every reference in it
// resolves, and public routes are exactly those the document exempts from security.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(testutil.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gw, err := gateway.New(context.Background(), nc, gateway.WithLogger(testutil.Logger()), gateway.WithGovernorInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()

	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	raw := gateway.OpenAPI()
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q, want 3.x", doc.OpenAPI)
	}
	documented := map[string]bool{}
	public := map[string]bool{}
	opIDs := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			key := strings.ToUpper(method) + " " + path
			documented[key] = true
			var o struct {
				OperationID string             `json:"operationId"`
				Security    *[]json.RawMessage `json:"security"`
				Responses   map[string]any     `json:"responses"`
			}
			if err := json.Unmarshal(op, &o); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if o.OperationID == "" || opIDs[o.OperationID] || len(o.Responses) == 0 {
				t.Errorf("%s: operationId %q missing or repeated, or no responses", key, o.OperationID)
			}
			opIDs[o.OperationID] = true
			if o.Security != nil && len(*o.Security) == 0 {
				public[key] = true
			}
		}
	}
	registered := map[string]bool{}
	for _, r := range gw.Routes() {
		key := r.Method + " " + r.Path
		registered[key] = true
		if !documented[key] {
			t.Errorf("route %s is not in openapi.json", key)
		}
		if (r.Access == gateway.Public) != public[key] {
			t.Errorf("route %s: access %s, but the document says public=%v", key, r.Access, public[key])
		}
	}
	var extra []string
	for key := range documented {
		if !registered[key] {
			extra = append(extra, key)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("openapi.json documents routes the gateway does not have: %v", extra)
	}

	// Every $ref points at a component that exists.
	var all map[string]any
	_ = json.Unmarshal(raw, &all)
	comps := all["components"].(map[string]any)
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				parts := strings.Split(strings.TrimPrefix(ref, "#/components/"), "/")
				if len(parts) != 2 || comps[parts[0]] == nil || comps[parts[0]].(map[string]any)[parts[1]] == nil {
					t.Errorf("unresolved $ref %s", ref)
				}
			}
			for _, y := range x {
				walk(y)
			}
		case []any:
			for _, y := range x {
				walk(y)
			}
		}
	}
	walk(all)
}
