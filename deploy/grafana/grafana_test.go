// Package grafana holds fanin's Grafana dashboards (fanin.json); its test checks that every query
// uses only metric names that fanin exports (internal/metrics).
package grafana

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/sdk/prom"
)

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboardJSON struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// PromQL words that are not metric names.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "le": true, "inf": true, "nan": true,
}

var (
	braces     = regexp.MustCompile(`\{[^}]*\}`)  // label matchers
	brackets   = regexp.MustCompile(`\[[^\]]*\]`) // ranges
	grouping   = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	strings_   = regexp.MustCompile(`"[^"]*"`) // string arguments
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	function   = regexp.MustCompile(`^\s*\(`)
	labelVals  = regexp.MustCompile(`label_values\(\s*([^,)]+)(,[^)]*)?\)`) // a Grafana variable's query
)

// metricNames returns the metric names a PromQL expression reads.
func metricNames(expr string) []string {
	e := labelVals.ReplaceAllString(expr, "$1")
	e = strings_.ReplaceAllString(e, `""`)
	e = braces.ReplaceAllString(e, "")
	e = brackets.ReplaceAllString(e, "")
	e = grouping.ReplaceAllString(e, "")
	var names []string
	for _, loc := range identifier.FindAllStringIndex(e, -1) {
		word := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // a number's exponent or unit
		}
		if promqlWords[strings.ToLower(word)] || function.MatchString(e[loc[1]:]) {
			continue
		}
		names = append(names, word)
	}
	return names
}

// The series names fanin exports: its metrics and the SDK's workers', with a histogram's _bucket,
// _sum and _count.
func exported() map[string]bool {
	out := map[string]bool{"up": true}
	all := metrics.Names()
	maps.Copy(all, prom.MetricNames())
	for name, typ := range all {
		out[name] = true
		if typ == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				out[name+suffix] = true
			}
		}
	}
	return out
}

func TestQueriesUseExistingMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("fanin.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboardJSON
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("fanin.json is not JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Fatalf("dashboard has no uid or title")
	}
	known := exported()
	var exprs []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				exprs = append(exprs, s)
			}
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("query %q reads no metric", e)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("query %q uses %s, which fanin does not export", e, n)
			}
			used[n] = true
		}
	}
	var unused []string
	for name := range metrics.Names() {
		found := false
		for u := range used {
			if strings.HasPrefix(u, name) {
				found = true
			}
		}
		if !found {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("metrics on no panel: %v", unused)
	}
	t.Logf("%d queries over %d metric names", len(exprs), len(used))
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]string{
		`histogram_quantile(0.99, sum by (le, fanin_job) (rate(fanin_runtime_queue_wait_seconds_bucket{fanin_job=~"$fanin_job"}[1m])))`: "fanin_runtime_queue_wait_seconds_bucket",
		`sum(fanin_autoscaler_pool_size * fanin_autoscaler_leader)`:                                                                     "fanin_autoscaler_pool_size fanin_autoscaler_leader",
		`min by (connection) (fanin_nats_connected) offset 5m > 0.5e3`:                                                                  "fanin_nats_connected",
		`label_values(fanin_runtime_invocations_total, fanin_job)`:                                                                      "fanin_runtime_invocations_total",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}
