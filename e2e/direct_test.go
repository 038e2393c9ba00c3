package e2e

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// directSpec is clusterSpec with gradients: direct: no gradient stream, the workers keep each
// step's gradients until the next step's parameters arrive and send them again on a gap.
func directSpec(id, fn string) job.Spec {
	s := clusterSpec(id, fn)
	s.Gradients = job.GradientsDirect
	return s
}

// TestFaultsDirectGradients runs the fault suite's runtime, nats-server and worker faults on jobs
// whose gradients go straight to the runtimes: runtime processes SIGKILLed at random moments (some
// during the recovery from the one before), nats-server SIGKILLed and restarted with file storage
// (the parameters and checkpoints survive; gradients in flight are sent again), and a worker
// process SIGKILLed in the middle of a step and restarted. Every step stays bit-exact.
func TestFaultsDirectGradients(t *testing.T) {
	skipShort(t)
	t.Run("runtime-kills", func(t *testing.T) {
		nn := startNATS(t, 1)
		f := startFanin(t, nn, 1)
		tt := f.train(directSpec("direct-kills", "adam"))
		tt.run(5)
		killRuntimesWhileTraining(t, tt, nn, rand.New(rand.NewPCG(5, 6)), 6)
	})
	t.Run("nats-kill", func(t *testing.T) {
		nn := startNATS(t, 1)
		f := startFanin(t, nn, 1)
		tt := f.train(directSpec("direct-natskill", "momentum"))
		tt.run(8)
		nn.kill(0)
		time.Sleep(time.Second) // NATS stays down a while, as a crashed server does
		nn.restart(0)
		tt.run(20)
		tt.checkUpdates(nn.url())
		t.Logf("%d steps bit-exact across a nats-server SIGKILL; longest gap %v", tt.step, tt.longestGap().Round(time.Millisecond))
	})
	t.Run("worker-kill", func(t *testing.T) {
		testWorkerKilledMidStep(t, directSpec("direct-workerkill", "adam"))
	})
	t.Run("cluster-node-loss", func(t *testing.T) {
		// 3 nodes, the parameters and checkpoints replicated on all: the node leading the
		// parameter stream is SIGKILLed (the runtimes and workers connected to it reconnect
		// elsewhere; gradients in flight are sent again), restarted, then stopped with SIGTERM.
		nn := startNATS(t, 3)
		f := startFanin(t, nn, 1)
		spec := directSpec("direct-replicated", "adam")
		spec.Replicas = 3
		tt := f.train(spec)
		tt.run(6)
		params := wire.ParamsStream(spec.ID)
		leader := nn.leaderOf(params)
		t.Logf("killing %s, leader of the parameter stream", leader)
		killed := time.Now()
		nn.kill(nn.index(leader))
		tt.run(14)
		killGap := tt.longestGapSince(killed)
		nn.restart(nn.index(leader))
		nn.waitCurrent()
		tt.run(18)
		leader = nn.leaderOf(params)
		t.Logf("stopping %s (SIGTERM), leader of the parameter stream", leader)
		stopped := time.Now()
		nn.stop(nn.index(leader))
		tt.run(24)
		stopGap := tt.longestGapSince(stopped)
		nn.restart(nn.index(leader))
		tt.run(28)
		tt.checkUpdates(nn.url())
		t.Logf("%d steps bit-exact across two node losses; longest gap after the kill %v, after the stop %v", tt.step, killGap.Round(time.Millisecond), stopGap.Round(time.Millisecond))
	})
}
