package autoscaler

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultPolicyIsValid(t *testing.T) {
	t.Parallel()
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	p, err := ParsePolicy([]byte(`
# only what differs from the defaults
target_utilization: 0.6
panic_window: 3s
max_runtimes: 12
packing: false
`))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultPolicy()
	want.TargetUtilization, want.PanicWindow, want.MaxRuntimes, want.Packing = 0.6, 3*time.Second, 12, false
	if p != want {
		t.Fatalf("got %+v\nwant %+v", p, want)
	}
	for _, empty := range []string{"", "  \n", "{}", "null"} {
		p, err := ParsePolicy([]byte(empty))
		if err != nil || p != DefaultPolicy() {
			t.Errorf("%q: got %+v, %v; want the defaults", empty, p, err)
		}
	}
	// JSON is YAML too.
	p, err = ParsePolicy([]byte(`{"min_runtimes": 2, "stable_window": "1m"}`))
	if err != nil || p.MinRuntimes != 2 || p.StableWindow != time.Minute {
		t.Fatalf("json: %+v, %v", p, err)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{`target_utilization: 1.5`, "target_utilization: must be in (0, 1], got 1.5"},
		{`target_utilization: 0`, "target_utilization: must be in (0, 1], got 0"},
		{`min_runtimes: 5` + "\nmax_runtimes: 2", "max_runtimes: must be >= min_runtimes (5), got 2"},
		{`min_runtimes: -1`, "min_runtimes: must be >= 0, got -1"},
		{`min_runtimes: 2.5`, `min_runtimes: want an integer, got "2.5"`},
		{`min_runtimes: "2"`, `min_runtimes: want an integer, not a string`},
		{`panic_window: 6`, `panic_window: want a duration string such as "6s", got 6`},
		{`panic_window: six`, `panic_window: want a duration such as "6s", got "six"`},
		{`stable_window: 0s`, "stable_window: must be > 0, got 0s"},
		{`panic_threshold: 0.5`, "panic_threshold: must be in [1, 100]"},
		{`max_scale_down_fraction: 0`, "max_scale_down_fraction: must be in (0, 1], got 0"},
		{`straggler_speed: 1`, "straggler_speed: must be in [0, 1) (0 disables), got 1"},
		{`migration_budget: -3`, "migration_budget: must be >= 0, got -3"},
		{`slowdown_budget: 1`, "slowdown_budget: must be in [0, 1) (a fraction of the step period; 0 disables), got 1"},
		{`headroom_period: -1s`, "headroom_period: must be >= 0, got -1s"},
		{`packing: maybe`, `packing: want a boolean, not a string: "maybe"`},
		{`packing: 2`, `packing: want true or false, got "2"`},
		{`scale_down_cooldown: -1s`, "scale_down_cooldown: must be >= 0, got -1s"},
		{`target_utilisation: 0.5`, `target_utilisation: unknown knob; known: min_runtimes, max_runtimes`},
		{`[1, 2]`, "invalid autoscaler policy"},
		{"a: [", "not YAML or JSON"},
	} {
		_, err := ParsePolicy([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.doc, err, tc.want)
			continue
		}
		if !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%q: %v does not wrap ErrInvalidPolicy", tc.doc, err)
		}
	}
	// Every problem is reported, each as a *PolicyError.
	_, err := ParsePolicy([]byte("target_utilization: 2\ncores_per_runtime: -1\nbogus: 1"))
	var pe *PolicyError
	if !errors.As(err, &pe) {
		t.Fatalf("%v is not a *PolicyError", err)
	}
	for _, f := range []string{"bogus", "target_utilization", "cores_per_runtime"} {
		if !strings.Contains(err.Error(), f+":") {
			t.Errorf("%v does not mention %s", err, f)
		}
	}
}

func TestPolicySetGet(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	for _, tc := range []struct{ knob, value, back string }{
		{"target_utilization", "0.55", "0.55"},
		{"stable_window", "90s", "1m30s"},
		{"max_runtimes", " 7 ", "7"},
		{"packing", "false", "false"},
		{"startup_grace", "0s", "0s"},
	} {
		if err := p.Set(tc.knob, tc.value); err != nil {
			t.Fatalf("Set(%s, %s): %v", tc.knob, tc.value, err)
		}
		if got, _ := p.Get(tc.knob); got != tc.back {
			t.Errorf("Get(%s) = %q, want %q", tc.knob, got, tc.back)
		}
	}
	if p.TargetUtilization != 0.55 || p.StableWindow != 90*time.Second || p.MaxRuntimes != 7 || p.Packing {
		t.Fatalf("fields not set: %+v", p)
	}
	if err := p.Set("nope", "1"); err == nil || !strings.Contains(err.Error(), "unknown knob") {
		t.Errorf("unknown knob: %v", err)
	}
	if err := p.Set("migration_budget", "lots"); err == nil || !strings.Contains(err.Error(), "want an integer") {
		t.Errorf("bad int: %v", err)
	}
	if err := p.Set("target_utilization", "NaN"); err == nil {
		t.Errorf("NaN accepted")
	}
	if len(KnobNames()) != 19 {
		t.Errorf("KnobNames() = %v", KnobNames())
	}
}

func TestPolicyJSONRoundTrip(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.PanicWindow = 1500 * time.Millisecond
	p.Packing = false
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"panic_window":"1.5s"`) || !strings.Contains(string(js), `"packing":false`) {
		t.Fatalf("marshal: %s", js)
	}
	back, err := ParsePolicy(js)
	if err != nil || back != p {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	back, err = ParsePolicy([]byte(p.YAML()))
	if err != nil || back != p {
		t.Fatalf("YAML round trip of\n%s: %+v, %v", p.YAML(), back, err)
	}
}
