package autoscaler

import (
	"fmt"
	"strings"
	"time"
)

// jobHeadroom is one job's factor on its work, and when the feedback last changed it.
type jobHeadroom struct {
	factor  float64
	changed time.Time
}

// The closed loop's steps and bounds: a job missing its slowdown budget gets 25% more headroom at
// each HeadroomPeriod; one well inside it (below half the budget) 10% less. The bounds keep a
// wrong measurement from reserving without limit, or from planning for much less than the work.
const (
	headroomGrow   = 1.25
	headroomShrink = 0.9
	minHeadroom    = 0.5
	maxHeadroom    = 4
)

// plannedWork is the work the model plans for a shard: its measured work times its job's headroom.
func plannedWork(s *ShardObs, hr map[string]float64) float64 {
	w := max(s.Work, 0)
	if f, ok := hr[s.Job]; ok {
		w *= f
	}
	return w
}

// feedback is the closed loop (Policy.SlowdownBudget): it measures each job's step slowdown, the
// longest QueueWait of its shards over its Period, and grows the job's headroom while it misses the
// budget and shrinks it while it is below half the budget, at most once per HeadroomPeriod. A job
// whose period is not measured yet keeps its headroom. It returns the headroom of every observed
// job that has one other than 1 (nil with the feedback off) and forgets the jobs no longer observed.
// Pending is not read: how many messages make a backlog depends on the job's ranks, which the
// decider does not observe, and a backlog shows in QueueWait too.
//
// While the pool is short (the last decision wanted more than max_runtimes), a low-priority job's
// headroom is not grown: the low class absorbs the slowdown, and more headroom for it would only
// take cores from the others. It still shrinks when the job is well inside its budget.
func (d *Decider) feedback(p Policy, obs Observations, now time.Time, say func(string, ...any)) map[string]float64 {
	if p.SlowdownBudget <= 0 {
		d.headroom = nil
		return nil
	}
	slow := map[string]float64{} // job -> measured slowdown
	seen := map[string]bool{}
	low := map[string]bool{}
	for i := range obs.Shards {
		s := &obs.Shards[i]
		seen[s.Job] = true
		low[s.Job] = s.Priority < PriorityNormal
		if s.Period > 0 {
			slow[s.Job] = max(slow[s.Job], max(s.QueueWait, 0).Seconds()/s.Period.Seconds())
		}
	}
	if d.headroom == nil {
		d.headroom = map[string]jobHeadroom{}
	}
	for job := range d.headroom {
		if !seen[job] {
			delete(d.headroom, job)
		}
	}
	var up, down, held []string
	for _, job := range sortedKeys(slow) {
		h, ok := d.headroom[job]
		if !ok {
			h.factor = 1
		}
		if ok && now.Sub(h.changed) < p.HeadroomPeriod {
			continue
		}
		x, was := slow[job], h.factor
		switch {
		case x > p.SlowdownBudget && h.factor < maxHeadroom && d.short && low[job]:
			held = append(held, fmt.Sprintf("%s %.2f at %.1f%%", job, h.factor, 100*x))
		case x > p.SlowdownBudget && h.factor < maxHeadroom:
			h = jobHeadroom{min(h.factor*headroomGrow, maxHeadroom), now}
			up = append(up, fmt.Sprintf("%s %.2f->%.2f at %.1f%%", job, was, h.factor, 100*x))
		case x < p.SlowdownBudget/2 && h.factor > minHeadroom:
			h = jobHeadroom{max(h.factor*headroomShrink, minHeadroom), now}
			down = append(down, fmt.Sprintf("%s %.2f->%.2f at %.1f%%", job, was, h.factor, 100*x))
		}
		d.headroom[job] = h
	}
	list := func(s []string) string {
		if len(s) > 5 {
			return strings.Join(s[:5], ", ") + fmt.Sprintf(" and %d more", len(s)-5)
		}
		return strings.Join(s, ", ")
	}
	if len(up) > 0 {
		say("headroom up for %d jobs over the %.1f%% slowdown budget: %s", len(up), 100*p.SlowdownBudget, list(up))
	}
	if len(held) > 0 {
		say("headroom held for %d low-priority jobs over the %.1f%% slowdown budget while the pool is short: %s", len(held), 100*p.SlowdownBudget, list(held))
	}
	if len(down) > 0 {
		say("headroom down for %d jobs well inside the %.1f%% slowdown budget: %s", len(down), 100*p.SlowdownBudget, list(down))
	}
	hr := map[string]float64{}
	for job, h := range d.headroom {
		if h.factor != 1 {
			hr[job] = h.factor
		}
	}
	return hr
}

// Headroom returns the closed loop's factor on each observed job's work (Policy.SlowdownBudget),
// for the jobs whose factor is not 1: a copy.
func (d *Decider) Headroom() map[string]float64 {
	hr := map[string]float64{}
	for job, h := range d.headroom {
		if h.factor != 1 {
			hr[job] = h.factor
		}
	}
	return hr
}
