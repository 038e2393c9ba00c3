package e2e

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
)

// TestFaultsSoak trains one job (adam, 3 replicas) on a 3-node cluster for FANIN_SOAK (say 30m),
// paced at 80% of the steps/s it reached in its first 20 s, with a fault every minute in turn: a
// runtime SIGKILL, a SIGKILL of the autoscaler leader (restarted 5 s later), a SIGKILL of a NATS
// node (restarted 5 s later). Every step is checked byte for byte and the stored parameters at the
// end; it reports the longest gap after each kind of fault and the memory of the gateway and the
// NATS nodes each minute, and fails if the gateway's grew by more than half from the end of the
// second minute to the end. FANIN_SOAK_GRADIENTS=direct trains a direct-gradients job instead
// (no gradient stream: the workers send each gradient again on a gap). Skipped unless FANIN_SOAK
// is set:
//
//	FANIN_SOAK=30m go test -run TestFaultsSoak -v -timeout 40m ./e2e/
func TestFaultsSoak(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("FANIN_SOAK"))
	if err != nil {
		t.Skip("a soak run: set FANIN_SOAK to its duration (e.g. 30m)")
	}
	every := time.Minute
	if v := os.Getenv("FANIN_SOAK_EVERY"); v != "" {
		if every, err = time.ParseDuration(v); err != nil || every < 10*time.Second {
			t.Fatalf("FANIN_SOAK_EVERY=%q: want a duration of 10s or more", v)
		}
	}
	burners, _ := strconv.Atoi(os.Getenv("FANIN_SOAK_BURN"))
	burnCores(t, burners)
	nn := startNATS(t, 3)
	f := startFanin(t, nn, 2)
	spec := clusterSpec("soak", "adam")
	spec.Replicas = 3
	switch g := os.Getenv("FANIN_SOAK_GRADIENTS"); g {
	case "", job.GradientsStored:
	case job.GradientsDirect:
		spec.Gradients = g
	default:
		t.Fatalf("FANIN_SOAK_GRADIENTS=%q: want %q or %q", g, job.GradientsStored, job.GradientsDirect)
	}
	t.Logf("gradients: %s", cmp.Or(spec.Gradients, job.GradientsStored))
	tt := f.train(spec)

	warm := time.Now()
	for time.Since(warm) < 20*time.Second {
		tt.run(tt.step + 1)
	}
	period := time.Duration(float64(time.Since(warm)) / float64(tt.step) / 0.8)
	t.Logf("max %.1f steps/s in the first 20 s; paced at one step every %v (80%%)", float64(tt.step)/time.Since(warm).Seconds(), period.Round(time.Millisecond))

	rng := rand.New(rand.NewPCG(7, 7))
	type fault struct {
		kind string
		at   time.Time
	}
	var faults []fault
	// What every autoscaler process did, killed ones included: a start/stop loop between two
	// leaders shows as many more starts and stops than runtime faults.
	var starts, stops, won int
	tally := func(out string) {
		starts += strings.Count(out, "runtime process started")
		stops += strings.Count(out, "runtime process stopping")
		won += strings.Count(out, "became the autoscaler leader")
	}
	var restart func()
	var restartAt time.Time
	mem := map[string][]int64{} // process -> RSS (KiB) each minute
	begin, nextFault, nextSample := time.Now(), time.Now().Add(every), time.Now()
	for time.Since(begin) < dur {
		stepAt := time.Now()
		tt.run(tt.step + 1)
		now := time.Now()
		if restart != nil && now.After(restartAt) {
			restart()
			restart = nil
		}
		if now.After(nextSample) {
			for name, pid := range longLived(f, nn) {
				mem[name] = append(mem[name], rssKiB(pid))
			}
			nextSample = nextSample.Add(time.Minute)
		}
		if now.After(nextFault) && restart == nil {
			kind := []string{"runtime", "autoscaler", "nats"}[len(faults)%3]
			switch kind {
			case "runtime":
				pids := runtimePids()
				ids := make([]string, 0, len(pids))
				for id := range pids {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				if len(ids) > 0 {
					for _, pid := range pids[ids[rng.IntN(len(ids))]] {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			case "autoscaler":
				i := f.leader()
				f.as[i].stop(syscall.SIGKILL)
				old := f.as[i]
				restart, restartAt = func() { tally(old.output()); f.startAutoscaler(i) }, now.Add(5*time.Second)
			case "nats":
				i := rng.IntN(3)
				nn.kill(i)
				restart, restartAt = func() { nn.restart(i) }, now.Add(5*time.Second)
			}
			faults = append(faults, fault{kind, now})
			nextFault = nextFault.Add(every)
		}
		if d := period - time.Since(stepAt); d > 0 {
			time.Sleep(d)
		}
	}
	if restart != nil {
		restart()
	}
	tt.run(tt.step + 3)
	tt.checkUpdates(nn.url())
	checkOneProcessPerID(t)

	at := make([]time.Time, len(faults))
	for k, fl := range faults {
		at[k] = fl.at
	}
	gaps := map[string][]time.Duration{}
	for k, g := range faultGaps(tt.done, at, 30*time.Second) {
		gaps[faults[k].kind] = append(gaps[faults[k].kind], g)
	}
	t.Logf("%d steps in %v, bit-exact, %d faults, a fault every %v, %d CPU burners", tt.step, time.Since(begin).Round(time.Second), len(faults), every, burners)
	for kind, gs := range gaps {
		slices.Sort(gs)
		t.Logf("after a %s fault (%d): longest gap between steps median %v, p99 %v, max %v", kind, len(gs),
			gs[len(gs)/2].Round(time.Millisecond), gs[(len(gs)*99)/100].Round(time.Millisecond), gs[len(gs)-1].Round(time.Millisecond))
	}
	for _, p := range f.as {
		tally(p.output())
	}
	t.Logf("autoscalers: %d runtime processes started, %d stopped, %d leaderships won", starts, stops, won)
	names := make([]string, 0, len(mem))
	for name := range mem {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		rss := mem[name]
		var cols []string
		for _, kb := range rss {
			cols = append(cols, strconv.FormatInt(kb/1024, 10))
		}
		t.Logf("RSS MiB of %s, each minute: %s", name, strings.Join(cols, " "))
		// The gateway lives through it all; NATS nodes are restarted, so their figures start over.
		if name == "gateway" && len(rss) > 3 && rss[1] > 0 && rss[len(rss)-1] > rss[1]*3/2 {
			t.Errorf("%s grew from %d to %d MiB", name, rss[1]/1024, rss[len(rss)-1]/1024)
		}
	}
}

// leader is the index of the autoscaler that leads now.
func (f *faninProcs) leader() int {
	for i, p := range f.as {
		if strings.Count(p.output(), "became the autoscaler leader") > strings.Count(p.output(), "lost the autoscaler leadership") {
			select {
			case <-p.done:
			default:
				return i
			}
		}
	}
	return 0
}

// longLived maps the processes that live through the whole soak (the gateway and the NATS nodes:
// runtimes and autoscalers are killed and replaced) to their pids.
func longLived(f *faninProcs, nn *natsNodes) map[string]int {
	out := map[string]int{}
	if f.gw != nil {
		out["gateway"] = f.gw.cmd.Process.Pid
	}
	for i, p := range nn.procs {
		if p != nil {
			out[fmt.Sprintf("nats-n%d", i)] = p.p.cmd.Process.Pid
		}
	}
	return out
}

// rssKiB is a process's resident set size in KiB (0 if it is gone).
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// faultGaps is, for each fault (its time in at, in order), the longest gap between two
// consecutive steps (done, in order) that it caused: a gap is charged to the last fault before
// the step that ended it, if the gap began within the given time of that fault. A gap that began
// just before a fault and ended after it is that fault's, not the one before's.
func faultGaps(done, at []time.Time, within time.Duration) []time.Duration {
	gaps := make([]time.Duration, len(at))
	for i := 1; i < len(done); i++ {
		k := sort.Search(len(at), func(k int) bool { return !at[k].Before(done[i]) }) - 1
		if k >= 0 && done[i-1].Before(at[k].Add(within)) {
			gaps[k] = max(gaps[k], done[i].Sub(done[i-1]))
		}
	}
	return gaps
}

func TestFaultGaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// Steps every 10 ms, with a 300 ms gap after the fault at 100 ms and a 2 s gap that begins
	// 5 ms before the fault at 1000 ms: it is the second fault's, not the first's.
	var done []time.Time
	for n := 0; n <= 110; n += 10 {
		done = append(done, ms(n))
	}
	for n := 410; n <= 995; n += 15 {
		done = append(done, ms(n))
	}
	done = append(done, ms(2995), ms(3005))
	at := []time.Time{ms(100), ms(1000)}
	got := faultGaps(done, at, 30*time.Second)
	want := []time.Duration{300 * time.Millisecond, 2000 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Fatalf("faultGaps = %v, want %v (a gap goes to the last fault before it ends)", got, want)
	}
	// Without the second fault its gap is the first's, unless it began more than within after it.
	if got := faultGaps(done, at[:1], 30*time.Second); got[0] != 2*time.Second {
		t.Fatalf("faultGaps of the first fault alone = %v, want [2s]", got)
	}
	if got := faultGaps(done, at[:1], 500*time.Millisecond); got[0] != 300*time.Millisecond {
		t.Fatalf("faultGaps within 500 ms = %v, want [300ms]: the 2 s gap began 895 ms after the fault", got)
	}
}
