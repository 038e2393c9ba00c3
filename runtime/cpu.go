package runtime

import "sync"

// cpuPool is the runtime's cores as tokens: aggregation work (folding a gradient, applying a step)
// runs only while it holds one, so at most cores of it run at once. The pool is shared by every
// shard the runtime serves: any ready shard runs on any free core, and no core is reserved for a
// shard. That is what makes a runtime one pooled server to the autoscaler
// (docs/design/autoscaler.md, "Work-conserving execution").
//
// When work waits for a core, the next free core goes to the waiting work of the highest priority
// class (the job's spec.priority: high, then normal, then low), first come first served within a
// class. A core is never taken from work that holds it. Under sustained overload the lower classes
// absorb the slowdown, but they do not starve: work that has seen maxBypass cores go to others
// since it began to wait takes the next one, whatever its class. Unbounded waiting would also hold
// the shard's lock, and so delay its release when the autoscaler moves it off this runtime.
type cpuPool struct {
	mu      sync.Mutex // guards free, waiting, spare and handed
	free    int        // tokens not held
	waiting [3]waitQueue
	spare   []*cpuWaiter // waiters to reuse, so that waiting allocates nothing in the steady state
	handed  uint64       // cores handed over to waiters so far
}

// maxBypass is how many cores may go to other work while a piece of work waits before it takes
// the next one, whatever its class.
const maxBypass = 64

// cpuWaiter is one piece of work waiting for a core; release hands the core over on ready (cap 1).
// since is the pool's handed count when it began to wait.
type cpuWaiter struct {
	ready chan struct{}
	since uint64
}

// waitQueue is a FIFO of waiters that reuses its array.
type waitQueue struct {
	items []*cpuWaiter
	head  int
}

func (q *waitQueue) push(w *cpuWaiter) { q.items = append(q.items, w) }
func (q *waitQueue) len() int          { return len(q.items) - q.head }
func (q *waitQueue) front() *cpuWaiter { return q.items[q.head] }

func (q *waitQueue) pop() *cpuWaiter {
	w := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head >= len(q.items)/2: // a queue that never empties: move the live part to the front
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return w
}

func newCPUPool(cores int) *cpuPool { return &cpuPool{free: cores} }

// classIndex maps a job's priority class (job.Spec.PriorityClass: -1, 0, 1) to a queue.
func classIndex(cls int) int { return min(max(cls, -1), 1) + 1 }

// acquire takes a core for work of priority class cls (-1 low, 0 normal, 1 high), waiting while
// none is free.
func (p *cpuPool) acquire(cls int) {
	p.mu.Lock()
	if p.free > 0 {
		p.free--
		p.mu.Unlock()
		return
	}
	var w *cpuWaiter
	if n := len(p.spare); n > 0 {
		w, p.spare = p.spare[n-1], p.spare[:n-1]
	} else {
		w = &cpuWaiter{ready: make(chan struct{}, 1)}
	}
	w.since = p.handed
	p.waiting[classIndex(cls)].push(w)
	p.mu.Unlock()
	<-w.ready // the core is handed over by release: p.free was not incremented
	p.mu.Lock()
	p.spare = append(p.spare, w)
	p.mu.Unlock()
}

// release gives a core back: to the first waiter of a lower class that has waited maxBypass
// handovers, else to the first waiter of the highest class waiting, or to the pool.
func (p *cpuPool) release() {
	p.mu.Lock()
	next := -1
	for c := range len(p.waiting) - 1 { // the lower classes, lowest first
		if q := &p.waiting[c]; q.len() > 0 && p.handed-q.front().since >= maxBypass {
			next = c
			break
		}
	}
	for c := len(p.waiting) - 1; next < 0 && c >= 0; c-- {
		if p.waiting[c].len() > 0 {
			next = c
		}
	}
	if next < 0 {
		p.free++
		p.mu.Unlock()
		return
	}
	w := p.waiting[next].pop()
	p.handed++
	p.mu.Unlock()
	w.ready <- struct{}{}
}

// queued is how many pieces of work wait for a core.
func (p *cpuPool) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for i := range p.waiting {
		n += p.waiting[i].len()
	}
	return n
}

// takeCore and giveCore take and give back one of the runtime's cores for the shard's work, at its
// job's priority class.
func (x *shardExec) takeCore() { x.r.cpu.acquire(x.ji.rec.Spec.PriorityClass()) }
func (x *shardExec) giveCore() { x.r.cpu.release() }
