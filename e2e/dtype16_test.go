package e2e

import (
	"context"
	"testing"

	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestSixteenBitGradientsAcrossKill trains an adam job (file storage) whose ranks publish bf16,
// f16, bf16 and f32 gradients, with runtimes as processes, and SIGKILLs one of them mid-run: the
// survivor replays the 16-bit gradients from the stream, and every step equals the reference fed
// the rounded gradients, bit for bit.
func TestSixteenBitGradientsAcrossKill(t *testing.T) {
	t.Parallel()
	skipShort(t)
	c := startCluster(t, "rt-0", "rt-1")
	rec, err := sdk.NewAdmin(c.api).CreateJob(context.Background(), clusterSpec("d16", "adam"))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, c.url, rec, wire.BF16, wire.F16, wire.BF16, wire.F32)
	tr.run(6)
	c.kill("rt-1")
	c.addRuntime(t, "rt-2")
	tr.run(14)
	t.Logf("trained %d steps of bf16/f16/f32 gradients bit-exact across a SIGKILL", tr.step)
}
