package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/dashboard"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestDashboardInChromium serves the dashboard next to a running fanin with two jobs training, and
// loads it in headless Chromium: the page renders the running jobs, the runtimes with their shards,
// the pool chart and the autoscaler's decisions. A screenshot is written to a temporary directory,
// or to docs/img/dashboard.png with FANIN_UPDATE_SCREENSHOT=1.
func TestDashboardInChromium(t *testing.T) {
	t.Parallel()
	skipShort(t)
	chromium := needTool(t, "Debian package chromium", "chromium", "chromium-browser", "google-chrome")
	st := testutil.Stack(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, err := nats.Connect(st.URL, nats.Name("dashboard"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	d, err := dashboard.New(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mux := http.NewServeMux()
	mux.Handle(dashboard.RootPattern, d)
	mux.Handle(dashboard.PrefixPattern, d)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, spec := range []job.Spec{
		{ID: "resnet-tiny", Ranks: 4, Tensors: []job.Tensor{{Name: "conv", Shape: []int{64, 3, 7, 7}}, {Name: "fc", Shape: []int{10, 2048}}},
			Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.001}}, ShardSize: 16 << 10},
		{ID: "mlp", Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{128, 64}}},
			Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 8 << 10},
	} {
		rec, err := st.Gateway.CreateJob(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		stop := testutil.TrainUntilStopped(t, st.URL, rec, 30*time.Millisecond)
		defer stop()
	}
	rej := wire.Rejectf(wire.ReasonNonFinite, "element 17 of shard 2 is NaN or Inf and the job does not allow them")
	rej.Job, rej.Shard, rej.Step, rej.Rank = "resnet-tiny", 2, 3, 1
	_ = nc.Publish(wire.RejectsSubject(rej.Job), rej.Marshal())

	// Let the dashboard see both jobs running and gather some history.
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		s := d.Snapshot()
		running := 0
		for _, j := range s.Jobs {
			if j.State == "running" {
				running++
			}
		}
		if running != 2 || len(s.History) < 5 {
			return fmt.Errorf("%d jobs running, %d samples", running, len(s.History))
		}
		return nil
	})

	dom := chrome(t, chromium, "--dump-dom", srv.URL+"/")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`<tr data-job="resnet-tiny" data-state="running"`),
		regexp.MustCompile(`<tr data-job="mlp" data-state="running"`),
		regexp.MustCompile(`data-runtime="rt-0"`),
		regexp.MustCompile(`data-shard="resnet-tiny\.0"`),
		regexp.MustCompile(`<path d="M[^"]+" [^>]*data-series="cores"`),
		regexp.MustCompile(`class="reason">non_finite<`),
		regexp.MustCompile(`id="conn"[^>]*data-state="live"`),
	} {
		if !want.MatchString(dom) {
			t.Errorf("the rendered page lacks %s", want)
		}
	}
	if strings.Contains(dom, "no decision yet") {
		t.Error("the rendered page shows no autoscaler decision")
	}
	if t.Failed() {
		t.Fatalf("DOM after the scripts ran:\n%s", tail(dom, 200))
	}

	out := filepath.Join(t.TempDir(), "dashboard.png")
	if os.Getenv("FANIN_UPDATE_SCREENSHOT") != "" {
		out = filepath.Join(repoRoot(t), "docs", "img", "dashboard.png")
	}
	chrome(t, chromium, "--screenshot="+out, "--window-size=1400,1250", srv.URL+"/")
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot %s: %v", out, err)
	}
	if b := img.Bounds(); b.Dx() != 1400 || b.Dy() != 1250 {
		t.Fatalf("screenshot is %v, want 1400x1250", b)
	}
	t.Logf("screenshot: %s (%d bytes)", out, len(data))
}

// chrome runs headless Chromium on a fresh profile; virtual time lets the page's polls and timers
// run, and the process returns once the page is idle.
func chrome(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1", "--mute-audio",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000"}
	cmd := exec.CommandContext(ctx, bin, append(flags, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, tail(stderr.String(), 30))
	}
	return stdout.String()
}
