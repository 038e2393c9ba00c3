package runtime

import (
	"log/slog"
	goruntime "runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
)

// The cores are one pool shared by all the runtime's work: any class takes any free core without
// waiting, up to the number of cores.
func TestCPUPoolIsShared(t *testing.T) {
	t.Parallel()
	p := newCPUPool(3)
	for _, cls := range []int{-1, 0, 1} { // three shards of three classes: none waits
		p.acquire(cls)
	}
	if p.free != 0 || p.queued() != 0 {
		t.Fatalf("free %d, queued %d after taking the 3 cores", p.free, p.queued())
	}
	done := make(chan struct{})
	go func() { p.acquire(1); close(done) }() // a fourth waits, even a high one: nothing is preempted
	waitQueued(t, p, 1)
	p.release()
	<-done
	for range 3 {
		p.release()
	}
	if p.free != 3 {
		t.Fatalf("free %d after all released, want 3", p.free)
	}
}

// A freed core goes to the waiting work of the highest class, first come first served within a
// class: with the one core held, work queues as low1, normal1, high1, low2, high2, normal2 and runs
// as high1, high2, normal1, normal2, low1, low2.
func TestCPUPoolOrdersByClassThenArrival(t *testing.T) {
	t.Parallel()
	p := newCPUPool(1)
	p.acquire(0)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	arrivals := []struct {
		name string
		cls  int
	}{{"low1", -1}, {"normal1", 0}, {"high1", 1}, {"low2", -1}, {"high2", 1}, {"normal2", 0}}
	for i, a := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.acquire(a.cls)
			mu.Lock()
			order = append(order, a.name)
			mu.Unlock()
			p.release() // hands the core to the next in line
		}()
		waitQueued(t, p, i+1) // queued in this order
	}
	p.release()
	wg.Wait()
	want := []string{"high1", "high2", "normal1", "normal2", "low1", "low2"}
	if !slices.Equal(order, want) {
		t.Fatalf("ran in order %v, want %v", order, want)
	}
	if p.free != 1 || p.queued() != 0 {
		t.Fatalf("free %d, queued %d at the end", p.free, p.queued())
	}
}

// Waiting reuses its waiters: in the steady state a contended acquire allocates nothing.
func TestCPUPoolWaitsWithoutAllocating(t *testing.T) {
	t.Parallel()
	p := newCPUPool(1)
	handoff := func() {
		p.acquire(0)
		done := make(chan struct{})
		go func() { p.acquire(-1); p.release(); close(done) }()
		waitQueued(t, p, 1)
		p.release()
		<-done
	}
	handoff() // the first wait makes the waiter
	before := len(p.spare)
	for range 10 {
		handoff()
	}
	if len(p.spare) != before || before != 1 {
		t.Fatalf("spare waiters %d, then %d: want the one reused", before, len(p.spare))
	}
}

// waitQueued yields until n pieces of work wait for a core (no clock: the test's own deadline
// catches a hang).
func waitQueued(t *testing.T, p *cpuPool, n int) {
	t.Helper()
	for p.queued() < n {
		goruntime.Gosched()
	}
}

// A shard's work takes its cores at its job's class, read from the job record the runtime holds:
// with the one core busy, a low job's shard that asked first runs after a high job's.
func TestShardTakesCoresAtItsJobsPriority(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	r := &Runtime{cpu: newCPUPool(1), log: log, rejects: newRejectLog(log, time.Now)}
	execOf := func(id, priority string) *shardExec {
		spec := job.Spec{ID: id, Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 2,
			Function: job.Function{Name: "sum"}, ShardSize: 4 << 10, Priority: priority}
		spec.Normalize()
		rec := job.NewRecord(spec, time.Now())
		x, err := newShardExec(r, &jobInfo{rec: &rec}, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	low, high := execOf("backfill", job.PriorityLow), execOf("urgent", job.PriorityHigh)
	r.cpu.acquire(0) // the core is busy
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, x := range []*shardExec{low, high} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.takeCore()
			mu.Lock()
			order = append(order, x.ji.rec.Spec.ID)
			mu.Unlock()
			x.giveCore()
		}()
		waitQueued(t, r.cpu, i+1)
	}
	r.cpu.release()
	wg.Wait()
	if want := []string{"urgent", "backfill"}; !slices.Equal(order, want) {
		t.Fatalf("ran %v, want %v", order, want)
	}
}

// A wait queue that never empties (waiters always behind the one served) keeps its array bounded
// by the waiters it holds, not by how many have ever waited.
func TestWaitQueueStaysBounded(t *testing.T) {
	t.Parallel()
	var q waitQueue
	ws := []*cpuWaiter{{}, {}, {}}
	for _, w := range ws[:2] {
		q.push(w)
	}
	for i := range 100000 {
		q.push(ws[(i+2)%3])
		if got, want := q.pop(), ws[i%3]; got != want {
			t.Fatalf("pop %d: not first in, first out", i)
		}
		if q.len() != 2 {
			t.Fatalf("pop %d: %d waiting, want 2", i, q.len())
		}
	}
	if c := cap(q.items); c > 16 {
		t.Errorf("after 100000 waits with at most 3 queued the queue's array holds %d slots", c)
	}
}

// Higher classes go first, but a lower class does not starve: work that has seen maxBypass cores
// go to higher-class work since it began to wait takes the next core.
func TestCPUPoolLowerClassesDoNotStarve(t *testing.T) {
	t.Parallel()
	p := newCPUPool(1)
	p.acquire(0) // the one core is held
	queue := func(cls int) *cpuWaiter {
		w := &cpuWaiter{ready: make(chan struct{}, 1)}
		p.mu.Lock()
		w.since = p.handed
		p.waiting[classIndex(cls)].push(w)
		p.mu.Unlock()
		return w
	}
	low := queue(-1)
	for i := 0; i <= maxBypass; i++ {
		high := queue(1) // high-class work is always waiting
		p.release()      // the holder finishes: the core goes to the next in line, which holds it
		select {
		case <-low.ready:
			if i != maxBypass {
				t.Fatalf("the low waiter took the core after %d handovers to high work, want %d", i, maxBypass)
			}
			return
		case <-high.ready:
		}
	}
	t.Fatalf("the low waiter still waits after %d handovers to high work", maxBypass+1)
}
