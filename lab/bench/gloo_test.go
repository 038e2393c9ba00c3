package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// TestGlooQuick runs the gloo scenario as `fanin bench --quick --only gloo` does (CI installs
// Debian's python3-torch): fanin's worker process and the gloo processes both run, gloo's
// parameters are checked against fanin's step, and every row is well-formed. Without torch the
// scenario must be one skipped row that says what is missing. Nothing is asserted about speed.
// Not parallel: gloo's rendezvous listens on a port freePort found free.
func TestGlooQuick(t *testing.T) {
	skipUnderRace(t)
	var progress bytes.Buffer
	res, err := Run(context.Background(), Config{Quick: true, Only: []string{"gloo"}, Log: testutil.Logger()}, &progress)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if _, terr := findTorch(context.Background()); terr != nil {
		if len(res) != 1 || !strings.Contains(res[0].Skipped, "torch") {
			t.Fatalf("without torch (%v): results %+v, want one skipped row naming torch", terr, res)
		}
		t.Skipf("no torch: %v", terr)
	}
	want := []string{"N=8,Shard=4MiB", "N=8,Shard=4MiB,bf16 gradients", "N=8,Shard=4MiB,bf16 gradients and parameters",
		"N=8,Shard=4MiB,direct", "N=8,Shard=4MiB,direct,bf16 gradients and parameters",
		"service cost,N=8,Shard=4MiB", "N=4,Shard=1MiB,p50", "N=4,Shard=1MiB,p99", "service cost,N=4,Shard=1MiB"}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(res), len(want), res)
	}
	for i, r := range res {
		if r.Case != want[i] || r.Skipped != "" || r.Err != "" {
			t.Errorf("result %d: %s, want case %q, not skipped or failed", i, r, want[i])
		}
		if !(r.Fanin > 0) || !(r.Base > 0) || r.Ratio != r.Fanin/r.Base {
			t.Errorf("%s: figures must be > 0 and the ratio fanin/baseline", r)
		}
	}
	if res[6].Goal != 1 || !res[6].LowerIsBetter || res[0].Goal != 1 || res[0].LowerIsBetter || res[1].Goal != 1.8 || res[2].Goal != 1.8 ||
		res[3].Goal != 0.6 || res[4].Goal != 1 {
		t.Errorf("goals: steps/s %+v, bf16 %+v, bf16 parameters %+v, direct %+v, direct bf16 %+v, p50 %+v", res[0], res[1], res[2], res[3], res[4], res[6])
	}
	md := Markdown(res, "go run ./cmd/fanin bench --quick --only gloo", "env")
	for _, s := range []string{"## gloo", "| gloo | N=4,Shard=1MiB,p50 |", "<= 1x", "BytePS"} {
		if !strings.Contains(md, s) {
			t.Errorf("Markdown lacks %q", s)
		}
	}
}

// TestGradientAt: the element formula the gloo check uses is fillGradient's.
func TestGradientAt(t *testing.T) {
	t.Parallel()
	g := make([]float32, 1000)
	for r := range 3 {
		fillGradient(g, r)
		for i, v := range g {
			if gradientAt(r, i) != v {
				t.Fatalf("gradientAt(%d, %d) = %v, fillGradient has %v", r, i, gradientAt(r, i), v)
			}
		}
	}
}

// TestCheckGlooSample: gloo's parameters pass when they are -steps*lr*mean gradient up to rounding,
// and fail when they are not (a sum instead of a mean, a missing step).
func TestCheckGlooSample(t *testing.T) {
	t.Parallel()
	w := workload{Ranks: 4, Elements: 1000}
	sample := func(steps int, scale float64) glooRank {
		rp := glooRank{TotalSteps: 12}
		for i := 0; i < w.Elements; i += 97 {
			var mean float64
			for r := range w.Ranks {
				mean += float64(gradientAt(r, i)) / float64(w.Ranks)
			}
			rp.SampleIndex = append(rp.SampleIndex, i)
			rp.Sample = append(rp.Sample, float64(float32(-float64(steps)*learningRate*mean*scale)))
		}
		return rp
	}
	if err := checkGlooSample(sample(12, 1), w); err != nil {
		t.Fatalf("the right parameters: %v", err)
	}
	for name, rp := range map[string]glooRank{"sum": sample(12, 4), "one step short": sample(11, 1), "none": {TotalSteps: 12}} {
		if err := checkGlooSample(rp, w); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestLatencyGoal: a latency goal is a maximum ratio.
func TestLatencyGoal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fanin, base, goal float64
		met               bool
	}{{5, 6, 1, true}, {6, 6, 1, true}, {7, 6, 1, false}, {7, 6, 0, true}, {7, 0, 1, false}} {
		r := latencyGoal(Result{Fanin: c.fanin, Base: c.base, Goal: c.goal})
		if r.Met != c.met || !r.LowerIsBetter {
			t.Errorf("fanin %v, baseline %v, goal %v: met %v, want %v", c.fanin, c.base, c.goal, r.Met, c.met)
		}
	}
	if r := latency(Result{Fanin: 7, Base: 6, Goal: 1}); !r.Met || r.Goal != 0 {
		t.Errorf("latency without a goal: %+v", r)
	}
}
