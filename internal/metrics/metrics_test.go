package metrics_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/metrics"
)

// Every metric in Names is produced once its component reports, with the type Names gives, and
// nothing fanin_* is produced that Names does not list.
func TestNamesAreWhatIsExported(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	rt := m.Runtime("rt-0")
	j := rt.Job("job-a")
	j.Gradient(4096)
	j.Invocation(3*time.Millisecond, time.Millisecond, 500*time.Microsecond)
	rt.Reject("job-a", "bad_length")
	rt.ReplyDropped("job-a")
	rt.Migration(20 * time.Millisecond)
	rt.Observe(2, func(yield func(metrics.ShardGauge)) {
		yield(metrics.ShardGauge{Job: "job-a", Pending: 3, Step: 7})
		yield(metrics.ShardGauge{Job: "job-a", Pending: 1, Step: 6})
	})
	a := m.Autoscaler()
	a.Decision(3, 6, 10, 4, 3.5, "stable", 2, 1)
	a.Leader(true)
	a.Error()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	m.HTTP(mux).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/jobs/x", nil))
	nc := natsConn(t)
	stop := m.WatchConn("test", nc)
	defer stop()

	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "fanin_") {
			got[f.GetName()] = strings.ToLower(f.GetType().String())
		}
	}
	want := metrics.Names()
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("%s: exported as %q, want a %s", name, got[name], typ)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is exported but not listed in Names", name)
		}
	}

	// The handler serves them in the text format, with the per-job aggregates of the shards.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, line := range []string{
		`fanin_runtime_shards{fanin_job="job-a",runtime="rt-0"} 2`,
		`fanin_runtime_pending_messages{fanin_job="job-a",runtime="rt-0"} 4`,
		`fanin_runtime_step{fanin_job="job-a",runtime="rt-0"} 6`,
		`fanin_runtime_rejects_total{fanin_job="job-a",reason="bad_length",runtime="rt-0"} 1`,
		`fanin_nats_connected{connection="test"} 1`,
		`fanin_autoscaler_desired_pool_size 4`,
		`fanin_http_requests_total{code="404",route="GET /v1/jobs/{id}"} 1`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// A runtime that stops, and a job it no longer serves, leave no series behind.
	rt.Close()
	rt.ForgetJob("job-a")
	fams, _ = m.Registry().Gather()
	var left []string
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == metrics.JobLabel {
					left = append(left, f.GetName())
				}
			}
		}
	}
	sort.Strings(left)
	if len(left) > 0 {
		t.Errorf("series of job-a left after ForgetJob and Close: %v", left)
	}
}

// Handles of a nil registry do nothing: instrumented code needs no checks when metrics are off.
func TestNilIsOff(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	rt := m.Runtime("x")
	rt.Job("j").Invocation(time.Second, time.Second, time.Second)
	rt.Job("j").Gradient(1)
	rt.Reject("j", "r")
	rt.Migration(time.Second)
	rt.Observe(1, nil)
	rt.Close()
	rt.ForgetJob("j")
	m.Autoscaler().Decision(1, 1, 1, 1, 1, "stable", 0, 0)
	m.Autoscaler().Leader(true)
	m.WatchConn("x", nil)()
	if m.HTTP(http.NotFoundHandler()) == nil {
		t.Error("HTTP of a nil registry returned nil")
	}
}

func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
