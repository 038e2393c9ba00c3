package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/lab/demo"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The elastic scenario's absorb case runs each elastic worker as an OS process (`fanin
// bench-elastic-worker`), SIGKILLs one, and splits the gap it leaves in the job's steps into the
// lapse fanin needs to call the worker dead and what follows the reassignment.

// ElasticWorkerEnv is set in the environment of the worker processes the bench starts: a test
// binary standing in for fanin (os.Executable) looks for it in TestMain and runs the worker.
const ElasticWorkerEnv = "FANIN_BENCH_ELASTIC_WORKER"

// ElasticWorkerCommand is the (hidden) fanin command that runs one elastic worker process.
const ElasticWorkerCommand = "bench-elastic-worker"

// ElasticWorkerConfig is one elastic worker process of the absorb case: the demo model's job Job
// with Ranks logical ranks, each rank's gradient taking at least Compute.
type ElasticWorkerConfig struct {
	URL, Job, ID string
	Ranks        int
	Compute      time.Duration
}

// Args is the command line that ParseElasticWorker reads back.
func (c ElasticWorkerConfig) Args() []string {
	return []string{"--nats", c.URL, "--job", c.Job, "--id", c.ID, "--ranks", strconv.Itoa(c.Ranks), "--compute", c.Compute.String()}
}

// ParseElasticWorker reads an elastic worker's command line.
func ParseElasticWorker(args []string) (ElasticWorkerConfig, error) {
	var c ElasticWorkerConfig
	fs := flag.NewFlagSet(ElasticWorkerCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.URL, "nats", "", "NATS URL")
	fs.StringVar(&c.Job, "job", "", "job id")
	fs.StringVar(&c.ID, "id", "", "worker id")
	fs.IntVar(&c.Ranks, "ranks", 4, "the job's logical ranks")
	fs.DurationVar(&c.Compute, "compute", rankCompute, "least time of one rank's gradient")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.URL == "" || c.Job == "" || c.ID == "" || c.Ranks < 1 || fs.NArg() > 0 {
		return c, errors.New("usage: bench-elastic-worker --nats URL --job ID --id WORKER [--ranks N] [--compute D]")
	}
	return c, nil
}

// RunElasticWorker steps an elastic worker on the demo model until ctx ends, then leaves. After
// every step it writes "step N" to out.
func RunElasticWorker(ctx context.Context, cfg ElasticWorkerConfig, out io.Writer) error {
	c, err := sdk.Connect(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer c.Close()
	e, err := c.Elastic(ctx, cfg.Job, sdk.WithWorkerID(cfg.ID))
	if err != nil {
		return err
	}
	model := demo.NewModel(demo.NewProblem(demo.DefaultConfig()))
	grad := func(_ context.Context, rank int, step int64, p, g []float32) error {
		began := time.Now()
		model.Gradient(p, rank, cfg.Ranks, step, g)
		computeFor(began, cfg.Compute)
		return nil
	}
	for ctx.Err() == nil {
		if _, err := e.Step(ctx, grad); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		if _, err := fmt.Fprintf(out, "step %d\n", e.StepCount()); err != nil {
			return err
		}
	}
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return e.Leave(lctx)
}

// workerProc is one elastic worker process of the absorb case.
type workerProc struct {
	id     string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{} // closed once the process is waited for
	err    error         // the process's exit, set before done is closed
}

// absorbRun is the absorb case's shared record: when each step completed (first report by any
// worker), each worker's last beat, and each assignment seen.
type absorbRun struct {
	mu        sync.Mutex // guards the fields below
	completed map[int64]time.Time
	beats     map[string]time.Time
	assigned  []assignSeen
	changed   chan struct{} // signalled (not closed) at every new step
}

type assignSeen struct {
	at      time.Time
	epoch   uint64
	workers []string // holding ranks
}

func (a *absorbRun) stepDone(s int64) {
	a.mu.Lock()
	if _, ok := a.completed[s]; !ok {
		a.completed[s] = time.Now()
	}
	a.mu.Unlock()
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

func (a *absorbRun) newest() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for s := range a.completed {
		n = max(n, s)
	}
	return n
}

// absorbKill is one kill's timeline.
type absorbKill struct {
	lastStep, lastBeat, killed, reassigned, firstStep time.Time
	step                                              time.Duration // a step's time before the kill
}

func benchAbsorb(ctx context.Context, rs *runState, kills int) ([]Result, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	const jobID = "absorb"
	st, _, _, done, err := demoStack(ctx, rs, jobID, "bsp", 0)
	if err != nil {
		return nil, err
	}
	defer done()
	run := &absorbRun{completed: map[int64]time.Time{}, beats: map[string]time.Time{}, changed: make(chan struct{}, 1)}

	// The bench's own view: every worker's beats, and every assignment the leader writes.
	nc, err := nats.Connect(st.URL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	sub, err := nc.Subscribe(wire.WorkersSubject(jobID), func(m *nats.Msg) {
		var b wire.WorkerBeat
		if json.Unmarshal(m.Data, &b) == nil {
			run.mu.Lock()
			run.beats[b.ID] = time.Now()
			run.mu.Unlock()
		}
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, wire.AssignBucket)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", wire.AssignBucket, err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := kv.Watch(watchCtx, jobID, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	defer watch.Stop()
	var watchWG sync.WaitGroup
	watchWG.Go(func() {
		for e := range watch.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var a wire.Assignment
			if json.Unmarshal(e.Value(), &a) != nil {
				continue
			}
			seen := assignSeen{at: time.Now(), epoch: a.Epoch}
			for _, w := range a.Workers {
				if len(w.Ranks) > 0 {
					seen.workers = append(seen.workers, w.ID)
				}
			}
			run.mu.Lock()
			run.assigned = append(run.assigned, seen)
			run.mu.Unlock()
		}
	})
	defer func() { stopWatch(); watchWG.Wait() }()

	// The worker processes; the bench's context ending kills them (exec.CommandContext).
	var procWG sync.WaitGroup
	procs := map[string]*workerProc{}
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Signal(syscall.SIGTERM) // leave
		}
		for _, p := range procs {
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				p.cmd.Process.Kill()
			}
		}
		procWG.Wait()
	}()
	start := func(id string) error {
		cfg := ElasticWorkerConfig{URL: st.URL, Job: jobID, ID: id, Ranks: 4, Compute: rankCompute}
		p := &workerProc{id: id, done: make(chan struct{})}
		p.cmd = command(ctx, exe, append([]string{ElasticWorkerCommand}, cfg.Args()...)...)
		p.cmd.Env = append(os.Environ(), ElasticWorkerEnv+"=1")
		p.cmd.Stderr = &p.stderr
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := p.cmd.Start(); err != nil {
			return fmt.Errorf("worker %s: %w", id, err)
		}
		procs[id] = p
		procWG.Go(func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if s, ok := strings.CutPrefix(sc.Text(), "step "); ok {
					if n, err := strconv.ParseInt(s, 10, 64); err == nil {
						run.stepDone(n)
					}
				}
			}
			p.err = p.cmd.Wait()
			close(p.done)
		})
		return nil
	}
	// waitStep waits until step s completed; a worker process that exits meanwhile is a failure.
	waitStep := func(s int64, alive []string) error {
		deadline := time.After(30*time.Second + 2*wire.WorkerLapse)
		for run.newest() < s {
			for _, id := range alive {
				select {
				case <-procs[id].done:
					return fmt.Errorf("worker %s exited: %v: %s", id, procs[id].err, lastLine(procs[id].stderr.String()))
				default:
				}
			}
			select {
			case <-run.changed:
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				return fmt.Errorf("no step %d (newest %d)", s, run.newest())
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}

	alive := []string{}
	for i := range 4 {
		id := fmt.Sprint("w", i)
		if err := start(id); err != nil {
			return nil, err
		}
		alive = append(alive, id)
	}
	var timeline []absorbKill
	next := 4
	for k := range kills {
		// Some steps on four workers (the replacement of the previous kill has its ranks), then
		// the kill right after a step completes.
		if err := waitStep(run.newest()+30, alive); err != nil {
			return nil, err
		}
		if err := waitStep(run.newest()+1, alive); err != nil {
			return nil, err
		}
		victim := alive[0] // the oldest goes first
		if err := procs[victim].cmd.Process.Kill(); err != nil {
			return nil, err
		}
		killed := time.Now()
		alive = alive[1:]
		<-procs[victim].done
		run.mu.Lock()
		before := int64(0)
		for s, at := range run.completed {
			if at.Before(killed) {
				before = max(before, s)
			}
		}
		tl := absorbKill{killed: killed, lastStep: run.completed[before], lastBeat: run.beats[victim],
			step: run.completed[before].Sub(run.completed[before-10]) / 10}
		run.mu.Unlock()
		if err := waitStep(before+1, alive); err != nil {
			return nil, fmt.Errorf("after killing %s: %w", victim, err)
		}
		run.mu.Lock()
		tl.firstStep = run.completed[before+1]
		for _, a := range run.assigned {
			if a.at.After(killed) && !slices.Contains(a.workers, victim) {
				tl.reassigned = a.at
				break
			}
		}
		run.mu.Unlock()
		if tl.reassigned.IsZero() || tl.reassigned.After(tl.firstStep) {
			return nil, fmt.Errorf("kill %d: step %d completed at %v without an assignment that drops %s first", k+1, before+1, tl.firstStep, victim)
		}
		timeline = append(timeline, tl)
		rs.printf("  elastic absorb: SIGKILL %d (%s): gap %v = %v last step to kill + %v kill to reassignment (%v after its last beat) + %v to the next step",
			k+1, victim, ms3(tl.firstStep.Sub(tl.lastStep)), ms3(tl.killed.Sub(tl.lastStep)), ms3(tl.reassigned.Sub(tl.killed)),
			ms3(tl.reassigned.Sub(tl.lastBeat)), ms3(tl.firstStep.Sub(tl.reassigned)))
		id := fmt.Sprint("w", next) // a replacement: four again
		next++
		if err := start(id); err != nil {
			return nil, err
		}
		alive = append(alive, id)
	}
	return absorbResults(timeline), nil
}

// absorbResults reports the kills' medians: the gap, and its split into the detection (last step
// to the assignment without the dead worker) and the rest (reassignment to the next step).
func absorbResults(tl []absorbKill) []Result {
	med := func(f func(absorbKill) time.Duration) (time.Duration, time.Duration) {
		v := make([]time.Duration, len(tl))
		for i, k := range tl {
			v[i] = f(k)
		}
		slices.Sort(v)
		return v[len(v)/2], v[len(v)-1]
	}
	gap, gapMax := med(func(k absorbKill) time.Duration { return k.firstStep.Sub(k.lastStep) })
	detect, detectMax := med(func(k absorbKill) time.Duration { return k.reassigned.Sub(k.lastStep) })
	sinceBeat, _ := med(func(k absorbKill) time.Duration { return k.reassigned.Sub(k.lastBeat) })
	rest, restMax := med(func(k absorbKill) time.Duration { return k.firstStep.Sub(k.reassigned) })
	step, _ := med(func(k absorbKill) time.Duration { return k.step })
	setup := fmt.Sprintf("the demo model, 4 logical ranks on 4 elastic worker processes (fanin %s; each rank's gradient %v), adam, bsp; %d SIGKILLs of the oldest worker right after a step, a replacement process joining after each", ElasticWorkerCommand, rankCompute, len(tl))
	lapse := fmt.Sprintf("the lapse after which a silent worker is dead (%v after its last beat)", wire.WorkerLapse)
	return []Result{
		latency(Result{Scenario: "elastic", Case: "absorb a lost worker", Metric: "s from the last step before a worker's SIGKILL to the next",
			Baseline: lapse, Fanin: gap.Seconds(), Base: wire.WorkerLapse.Seconds(), Setup: setup,
			Notes: fmt.Sprintf("median of %d; max %v; = detection + the rest (next rows)", len(tl), ms3(gapMax))}),
		latency(Result{Scenario: "elastic", Case: "absorb: detection", Metric: "s from the last step before the SIGKILL to the assignment without the dead worker",
			Baseline: lapse, Fanin: detect.Seconds(), Base: wire.WorkerLapse.Seconds(), Setup: setup,
			Notes: fmt.Sprintf("median; max %v; the assignment came %v after the dead worker's last beat (median): the lapse, plus up to one leader tick (200ms); less than the lapse from the last step because the last beat was before it", ms3(detectMax), ms3(sinceBeat))}),
		latency(Result{Scenario: "elastic", Case: "absorb: the rest", Metric: "s from the reassignment to the next completed step",
			Baseline: "a step before the kill (median of the 10 before)", Fanin: rest.Seconds(), Base: step.Seconds(), Setup: setup,
			Notes: fmt.Sprintf("median; max %v; the survivors re-read the assignment every 250ms while they wait for a step (sdk), then compute the dead worker's ranks and publish them", ms3(restMax))}),
	}
}

func ms3(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
