package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The fault suite: fanin as separate processes (gateway, autoscalers with the process driver, the
// runtimes they start) against nats-server processes with file storage. Every case trains with
// workers that check every step byte for byte against the single-process reference, checks that
// each shard's parameters stream ends at exactly the step trained (one update per step), and ends
// with the API and the autoscaler working again without any human action: a new job is created,
// placed and trained.

// faultPolicy spreads shards over three runtimes (no packing), so that every kill hits shards.
const faultPolicy = `
min_runtimes: 3
max_runtimes: 3
packing: false
startup_grace: 1s
`

type faninProcs struct {
	t     *testing.T
	nn    *natsNodes
	api   string
	gw    *proc
	as    []*proc
	asDir []string
	pol   string
}

// startFanin starts the gateway and n autoscalers (process driver, each its own --process-dir)
// against nn.
func startFanin(t *testing.T, nn *natsNodes, autoscalers int) *faninProcs {
	t.Helper()
	f := &faninProcs{t: t, nn: nn, pol: filepath.Join(t.TempDir(), "policy.yaml")}
	if err := os.WriteFile(f.pol, []byte(faultPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := start(t, "gateway", "gateway", "--nats", nn.url(), "--http", "127.0.0.1:0")
	f.api, f.gw = gw.waitFor(t, httpURL, 30*time.Second), gw
	for i := range autoscalers {
		f.asDir = append(f.asDir, t.TempDir())
		f.as = append(f.as, nil)
		f.startAutoscaler(i)
	}
	return f
}

func (f *faninProcs) startAutoscaler(i int) {
	f.as[i] = start(f.t, fmt.Sprintf("autoscaler-%d", i), "autoscaler", "--nats", f.nn.url(), "--driver", "process",
		"--policy", f.pol, "--interval", "200ms", "--process-dir", f.asDir[i], "--runtime-metrics", "")
}

// runtimePids maps the id of every running `fanin runtime` process to its pid (from /proc).
func runtimePids() map[string][]int {
	out := map[string][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 4 || args[0] != faninBin || args[1] != "runtime" || args[2] != "--id" {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(d, "/")[2])
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(st), ") Z ") {
			continue // exited, not reaped yet
		}
		out[args[3]] = append(out[args[3]], pid)
	}
	return out
}

// checkOneProcessPerID fails if two processes run one runtime id.
func checkOneProcessPerID(t *testing.T) {
	t.Helper()
	for id, pids := range runtimePids() {
		if len(pids) > 1 {
			t.Errorf("runtime id %s runs as %d processes: %v", id, len(pids), pids)
		}
	}
}

// timedTrainer is a trainer that records when each step completed.
type timedTrainer struct {
	*trainer
	rec  *job.Record
	done []time.Time
}

func (tt *timedTrainer) run(to int64) {
	for tt.step < to {
		tt.trainer.run(tt.step + 1)
		tt.done = append(tt.done, time.Now())
	}
}

// longestGapSince is the longest time between two consecutive steps, of those that ended after t:
// the step in progress at t included, so the gap a fault at t caused.
func (tt *timedTrainer) longestGapSince(t time.Time) time.Duration {
	var g time.Duration
	for i := 1; i < len(tt.done); i++ {
		if tt.done[i].After(t) {
			g = max(g, tt.done[i].Sub(tt.done[i-1]))
		}
	}
	return g
}

// longestGap is the longest time between two consecutive steps.
func (tt *timedTrainer) longestGap() time.Duration {
	var g time.Duration
	for i := 1; i < len(tt.done); i++ {
		g = max(g, tt.done[i].Sub(tt.done[i-1]))
	}
	return g
}

// checkUpdates checks that every shard's parameters are at step tt.step: one update per step, none
// lost, none applied twice (the byte-for-byte checks of every step already rule out a double one).
func (tt *timedTrainer) checkUpdates(url string) {
	t := tt.t
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(tt.rec.Spec.ID)), tt.rec, tt.step)
	if !bytes.Equal(f32bytes(got), f32bytes(tt.ref.Params())) {
		t.Fatalf("job %s: the stored parameters of step %d differ from the reference", tt.rec.Spec.ID, tt.step)
	}
}

func (f *faninProcs) train(spec job.Spec) *timedTrainer {
	f.t.Helper()
	return f.trainAt(spec, f.nn.url())
}

// trainAt is train with the workers connected to url.
func (f *faninProcs) trainAt(spec job.Spec, url string) *timedTrainer {
	f.t.Helper()
	var rec *job.Record
	testutil.CheckFor(f.t, 60*time.Second, 250*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := sdk.NewAdmin(f.api).CreateJob(ctx, spec)
		if err != nil && strings.Contains(err.Error(), "exists") {
			r, err = sdk.NewAdmin(f.api).Job(ctx, spec.ID)
		}
		rec = r
		return err
	})
	tt := &timedTrainer{trainer: newTrainer(f.t, url, rec), rec: rec}
	tt.onStall = func() { f.nn.dumpJob(rec); f.dumpLogs() }
	return tt
}

// dumpLogs logs the last warnings and errors of the autoscalers and of the runtimes they started
// (whose output is theirs): when a step stalls in CI, they say what the runtime was waiting for.
func (f *faninProcs) dumpLogs() {
	for i, as := range f.as {
		if as == nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(as.output(), "\n") {
			if (strings.Contains(l, "WARN") || strings.Contains(l, "ERROR")) && !strings.Contains(l, "cannot reach NATS") {
				lines = append(lines, l)
			}
		}
		f.t.Logf("autoscaler-%d and its runtimes, the last %d of %d warnings and errors:\n%s", i, min(len(lines), 80), len(lines), strings.Join(lines[max(0, len(lines)-80):], "\n"))
	}
}

// afterFaults shows the API and the autoscaler working without anyone's help: jobs are listed, and a
// new job is created, placed and trained bit-exact.
func (f *faninProcs) afterFaults(id string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := sdk.NewAdmin(f.api).Jobs(ctx); err != nil {
		f.t.Fatalf("jobs ls after the faults: %v", err)
	}
	tt := f.train(clusterSpec(id, "sgd"))
	tt.run(5)
	tt.checkUpdates(f.nn.url())
}

// Runtime processes SIGKILLed many times at random moments, some during the recovery from the one
// before: every step stays bit-exact, and the longest gap between steps is reported.
func TestFaultsRuntimeKills(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 1)
	tt := f.train(clusterSpec("kills", "adam"))
	tt.run(5)
	killRuntimesWhileTraining(t, tt, nn, rand.New(rand.NewPCG(1, 2)), 12)
	f.afterFaults("after-kills")
}

// killRuntimesWhileTraining SIGKILLs a random runtime process kills times, between 0 and 3 steps
// apart (a kill may come while the previous one is being recovered), then checks that every step
// was bit-exact and that no runtime id runs twice, and reports the longest gap between steps.
func killRuntimesWhileTraining(t *testing.T, tt *timedTrainer, nn *natsNodes, rng *rand.Rand, kills int) {
	t.Helper()
	for k := range kills {
		tt.run(tt.step + int64(rng.IntN(4)))
		victim, ok := killRandomRuntime(rng)
		if !ok {
			tt.run(tt.step + 1)
			continue
		}
		t.Logf("kill %d: runtime %s at step %d", k+1, victim, tt.step)
	}
	tt.run(tt.step + 5)
	tt.checkUpdates(nn.url())
	checkOneProcessPerID(t)
	t.Logf("%d steps bit-exact across %d runtime SIGKILLs; longest gap between steps %v", tt.step, kills, tt.longestGap().Round(time.Millisecond))
}

// killRandomRuntime SIGKILLs the processes of one runtime id picked by rng among those running
// (sorted, so that a seed picks the same victims), and reports which; false when none runs.
func killRandomRuntime(rng *rand.Rand) (string, bool) {
	pids := runtimePids()
	if len(pids) == 0 {
		return "", false
	}
	ids := slices.Sorted(maps.Keys(pids))
	victim := ids[rng.IntN(len(ids))]
	for _, pid := range pids[victim] {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return victim, true
}

// nats-server SIGKILLed and restarted (file storage) in the middle of training: training goes on
// bit-exact, and afterwards a new job is placed and trains.
func TestFaultsNATSKill(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 1)
	tt := f.train(clusterSpec("natskill", "momentum"))
	tt.run(8)
	nn.kill(0)
	time.Sleep(time.Second) // NATS stays down a while, as a crashed server does
	nn.restart(0)
	tt.run(20)
	tt.checkUpdates(nn.url())
	t.Logf("%d steps bit-exact across a nats-server SIGKILL; longest gap %v", tt.step, tt.longestGap().Round(time.Millisecond))
	f.afterFaults("after-natskill")
	pool, err := sdk.NewAdmin(f.api).Pool(context.Background())
	if err != nil || len(pool.Runtimes) == 0 {
		t.Fatalf("fanin pool after the restart: %v, %+v", err, pool)
	}
}

// A 3-node cluster: the node leading a job's gradient stream is SIGKILLed, then the node leading the
// jobs bucket, then the gradient stream's leader is stopped with SIGTERM. Training goes on; while a
// node is down, jobs are listed, a new job is created, placed and trained.
func TestFaultsClusterNodeLoss(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 3)
	f := startFanin(t, nn, 1)
	spec := clusterSpec("replicated", "adam")
	spec.Replicas = 3
	tt := f.train(spec)
	tt.run(6)

	jobStreams := []string{wire.GradStream("replicated"), wire.ParamsStream("replicated")}
	leader := nn.leaderOf(wire.GradStream("replicated"))
	t.Logf("killing %s, leader of the gradient stream", leader)
	killed := time.Now()
	nn.kill(nn.index(leader))
	election := nn.elected(killed, leader, jobStreams...)
	tt.run(14)
	gradGap, gradElection := tt.longestGapSince(killed), <-election
	nn.restart(nn.index(leader))
	nn.waitCurrent()
	tt.run(18)

	leader = nn.leaderOf("KV_" + wire.JobsBucket)
	t.Logf("killing %s, leader of the jobs bucket (and of: %s)", leader, strings.Join(ledBy(t, nn, leader), ", "))
	killed = time.Now()
	nn.kill(nn.index(leader))
	election = nn.elected(killed, leader, append(jobStreams, "KV_"+wire.JobsBucket)...)
	tt.run(24)
	jobsGap, jobsElection := tt.longestGapSince(killed), <-election
	f.afterFaults("while-down") // a job of one replica: three cannot be placed on two servers
	nn.restart(nn.index(leader))
	nn.waitCurrent()
	tt.run(30)

	// A node stopped, not killed (a rolling restart, a drained Kubernetes node): nats-server hands
	// the leadership of what it leads to another node before it exits, with no election timeout.
	leader = nn.leaderOf(wire.GradStream("replicated"))
	t.Logf("stopping %s (SIGTERM), leader of the gradient stream", leader)
	killed = time.Now()
	nn.stop(nn.index(leader))
	tt.run(36)
	stopGap := tt.longestGapSince(killed)
	nn.restart(nn.index(leader))
	tt.run(40)

	tt.checkUpdates(nn.url())
	t.Logf("%d steps bit-exact across three node losses; longest gap between steps after losing the gradient stream's leader %v (its streams had leaders again after %v), the jobs bucket's leader %v (after %v), after stopping the gradient stream's leader %v",
		tt.step, gradGap.Round(time.Millisecond), gradElection.Round(time.Millisecond), jobsGap.Round(time.Millisecond), jobsElection.Round(time.Millisecond), stopGap.Round(time.Millisecond))
}

// ledBy lists fanin's buckets and streams the node named node leads.
func ledBy(t *testing.T, nn *natsNodes, node string) []string {
	var out []string
	for _, b := range []string{wire.JobsBucket, wire.PlacementBucket, wire.RuntimesBucket, wire.LeaderBucket, wire.PolicyBucket, wire.HandoverBucket} {
		if nn.leaderOf("KV_"+b) == node {
			out = append(out, b)
		}
	}
	return out
}

// Two autoscalers; the leader is SIGKILLed: its runtimes die with it, the other takes over within
// the lock's TTL and starts its own; the killed one restarts and follows. Then the new leader is
// killed too and the restarted one takes over. No runtime id ever runs twice.
func TestFaultsAutoscalerKill(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 2)
	tt := f.train(clusterSpec("askill", "adam"))
	tt.run(5)
	for round := range 2 {
		lead := -1
		testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
			for i, p := range f.as {
				if strings.Count(p.output(), "became the autoscaler leader") > strings.Count(p.output(), "lost the autoscaler leadership") {
					lead = i
					return nil
				}
			}
			return errors.New("no autoscaler leads")
		})
		before := runtimePids()
		t.Logf("round %d: killing autoscaler-%d, the leader, and with it %d runtimes", round, lead, len(before))
		f.as[lead].stop(syscall.SIGKILL)
		testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			for id := range runtimePids() {
				if _, ok := before[id]; ok {
					return fmt.Errorf("runtime %s outlived its autoscaler", id)
				}
			}
			return nil
		})
		tt.run(tt.step + 6)
		f.startAutoscaler(lead)
		tt.run(tt.step + 3)
		checkOneProcessPerID(t)
	}
	tt.checkUpdates(nn.url())
	t.Logf("%d steps bit-exact across 2 autoscaler SIGKILLs; longest gap %v", tt.step, tt.longestGap().Round(time.Millisecond))
	f.afterFaults("after-askill")
}

// The autoscaler leader stalls (SIGSTOP, as a process starved on a loaded machine) for longer than
// the lock's TTL, then resumes. The other takes over and adopts the stalled one's runtimes, which
// still run (their driver is not dead): it starts and stops none for the change, and training goes
// on bit-exact. The stalled one, resumed, knows it no longer leads. Before, the new leader started
// runtimes of its own beside the adopted ones and then stopped and started them, one a second.
func TestFaultsAutoscalerStalled(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 2)
	tt := f.train(clusterSpec("asstall", "adam"))
	tt.run(5)
	lead := -1
	testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		for i, p := range f.as {
			if strings.Count(p.output(), "became the autoscaler leader") > 0 && len(runtimePids()) == 3 {
				lead = i
				return nil
			}
		}
		return errors.New("no autoscaler leads three runtimes")
	})
	other := 1 - lead
	before := runtimePids()
	t.Logf("stalling autoscaler-%d, the leader of %d runtimes", lead, len(before))
	if err := f.as[lead].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stalled := time.Now()
	for !strings.Contains(f.as[other].output(), "became the autoscaler leader") { // training goes on
		if time.Since(stalled) > 20*time.Second {
			t.Fatal("the other autoscaler has not taken over")
		}
		tt.run(tt.step + 1)
	}
	t.Logf("autoscaler-%d took over after %v", other, time.Since(stalled).Round(time.Millisecond))
	tt.run(tt.step + 10)
	if err := f.as[lead].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if !strings.Contains(f.as[lead].output(), "lost the autoscaler leadership") {
			return errors.New("the resumed autoscaler does not know it lost the leadership")
		}
		return nil
	})
	tt.run(tt.step + 10)
	out := f.as[other].output()
	if n, m := strings.Count(out, "runtime process started"), strings.Count(out, "runtime process stopping"); n+m > 0 {
		t.Errorf("the new leader started %d and stopped %d runtimes beside the %d it adopted", n, m, len(before))
	}
	now := runtimePids()
	for id := range before {
		if _, ok := now[id]; !ok {
			t.Errorf("adopted runtime %s was stopped", id)
		}
	}
	checkOneProcessPerID(t)
	tt.checkUpdates(nn.url())
	t.Logf("%d steps bit-exact across a %v stall of the leader; longest gap %v", tt.step,
		time.Since(stalled).Round(time.Second), tt.longestGapSince(stalled).Round(time.Millisecond))
	f.afterFaults("after-asstall")
}

// A worker process SIGKILLed in the middle of publishing a step (it has published one shard of it),
// then restarted: it reads the parameters of one step for every shard, resumes the step it had half
// published under the same message ids, and the run ends byte-identical to the reference.
func TestFaultsWorkerKilledMidStep(t *testing.T) {
	if os.Getenv("FANIN_E2E_WORKER") != "" {
		os.Exit(workerMain())
	}
	skipShort(t)
	testWorkerKilledMidStep(t, clusterSpec("workerkill", "adam"))
}

// testWorkerKilledMidStep is TestFaultsWorkerKilledMidStep for a job of spec (made 2 ranks).
func testWorkerKilledMidStep(t *testing.T, spec job.Spec) {
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 1)
	spec.Ranks = 2
	tt := f.train(spec) // the reference, and the initial parameters
	const steps, crashAt = 12, 5
	run := func(rank int, crash int64) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFaultsWorkerKilledMidStep$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("FANIN_E2E_WORKER=%s|%s|%d|%d|%d", nn.url(), spec.ID, rank, steps, crash))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	w0, w1 := run(0, 0), run(1, crashAt)
	err := w1.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("worker 1 was to die by SIGKILL in step %d: %v", crashAt, err)
	}
	w1 = run(1, 0)
	for i, w := range []*exec.Cmd{w0, w1} {
		if err := w.Wait(); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	// The reference, stepped with the same gradients.
	fn, _ := tt.rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 2, tt.rec.Layout.Ranges(), tt.params)
	params := slices.Clone(tt.params)
	g := [][]float32{make([]float32, len(params)), make([]float32, len(params))}
	for s := int64(1); s <= steps; s++ {
		for r := range g {
			testutil.Gradient(g[r], params, s, r)
		}
		ref.Step(g, nil)
		params = append(params[:0], ref.Params()...)
	}
	tt.ref, tt.step = ref, steps
	tt.checkUpdates(nn.url())
	t.Logf("%d steps byte-identical to the reference with a worker SIGKILLed in the middle of step %d", steps, crashAt)
}

// workerMain is a worker process: rank r of a job trains to a step, from wherever its parameters
// are; with crash > 0 it publishes one shard of step crash, as the SDK would, and SIGKILLs itself.
func workerMain() int {
	parts := strings.Split(os.Getenv("FANIN_E2E_WORKER"), "|")
	url, id := parts[0], parts[1]
	rank, _ := strconv.Atoi(parts[2])
	steps, _ := strconv.ParseInt(parts[3], 10, 64)
	crash, _ := strconv.ParseInt(parts[4], 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w, err := c.Worker(ctx, id, rank)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	at, params, err := w.Params(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rec := w.Job()
	g := make([]float32, len(params))
	for s := at + 1; s <= steps; s++ {
		testutil.Gradient(g, params, s, rank)
		if s == crash {
			sh := rec.Layout.Shards[0]
			m := wire.GradMsg(wire.Grad{Job: id, Shard: sh.ID, Step: s, Rank: rank}, f32bytes(g[sh.Off:sh.Off+sh.Len]))
			if rec.Spec.DirectGradients() { // a request the shard's runtime answers with its receipt
				if _, err := c.Conn().RequestMsgWithContext(ctx, m); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			} else {
				js, _ := jetstream.New(c.Conn())
				if _, err := js.PublishMsg(ctx, m); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		if params, err = w.Step(ctx, g); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d step %d: %v\n", rank, s, err)
			return 1
		}
	}
	return 0
}
