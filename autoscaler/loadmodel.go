package autoscaler

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// The load model.
//
// A shard's load is periodic: every Period, starting at Phase (an offset from the Unix epoch), its
// Work (core-seconds at speed 1) arrives spread evenly over Burst. What a set of shards needs is not
// the sum of their peak rates: bursts that do not coincide share cores.
//
// Phase-locked jobs (a class: periods within lockTolerance of each other, e.g. replicas of one
// model on the same hardware) keep their relative phases, so their load is predicted exactly on a
// ring of profileSlots slots covering one period from now: slot i covers [now + i*H/S,
// now + (i+1)*H/S) for the class's period H, and each shard's next burst is laid onto it, its tail
// wrapping to the start. A slot holds the average cores the class needs in it. Two jobs of a class
// whose bursts fall in different slots share cores; overlapping ones add up.
//
// Jobs of different classes drift against each other: with periods of 1.0s and 1.6s every
// alignment of their bursts comes round every 2.7s, so a snapshot of their summed profile is only
// right for a moment, and its maximum over any window of seconds is the sum of their peaks: static
// provisioning. The decider treats classes as independent instead and sizes for
//
//	demand = steady + min(sum of class peaks, max(mean + z*sd, mean + max over classes of (peak - mean)))
//
// where mean and sd are those of the summed load of the classes (the means add, and so do the
// variances of independent classes; each class's mean, variance and peak are read off its ring), z
// is Policy.OverlapSigmas, and the second term says that the biggest class will reach its peak
// while the others run at their mean. The same formula sizes the pool (all shards) and decides
// whether a shard fits on a runtime (the shards on it).
//
// Policy.DelayBudget widens every burst by that fraction of its period: a step's aggregation may
// take that much longer than its burst, which lowers the peak rate planned for.
//
// Resolution is one slot: a burst shorter than a slot is spread over the slot, and a burst longer
// than its period is a steady Work/Period. A shard whose Period is not measured yet (0) is treated
// as steady: Work / max(Burst, Policy.UnknownBurst) cores at all times (with the default of 1s, its
// work once a second, spread evenly), until the first measurements one or two steps later. A
// smaller UnknownBurst is more conservative.
//
// With Policy.Packing off, every shard is assumed to burst at the same time: demand is the sum of
// the peak rates, as static provisioning reserves.
const (
	profileSlots  = 128
	lockTolerance = 0.001
	eps           = 1e-9
)

// model is one decision's load model: the shards' groups (a job's shards with one timing) and the
// classes of phase-locked groups.
type model struct {
	groups  []group
	groupOf []int // index in Observations.Shards -> group
	classes int
	slots   int // profileSlots, or 1 without packing
	z       float64
	packing bool
}

// group is the shards of one job with one timing; they share a load shape.
type group struct {
	job    string
	class  int       // -1: steady (period not measured)
	steady float64   // steady: cores per core-second of work per step
	dense  []float64 // cores per core-second of work per step, per slot of its class's ring
	shape  []slotLoad
	// sums over the shape, for updating a ring's mean and variance in O(len(shape))
	sumY, sumY2, peakY float64
	work               float64
}

type slotLoad struct {
	slot int32
	load float64
}

func newModel(p Policy, shards []ShardObs, order []int, now time.Time, hr map[string]float64) *model {
	m := &model{groupOf: make([]int, len(shards)), slots: profileSlots, z: p.OverlapSigmas, packing: p.Packing}
	if !p.Packing {
		m.slots = 1
	}
	type timing struct {
		job                  string
		period, phase, burst time.Duration
	}
	index := map[timing]int{}
	var timings []timing
	for _, oi := range order {
		s := &shards[oi]
		t := timing{s.Job, max(s.Period, 0), s.Phase, max(s.Burst, 0)}
		g, ok := index[t]
		if !ok {
			g = len(m.groups)
			index[t] = g
			timings = append(timings, t)
			m.groups = append(m.groups, group{job: s.Job, class: -1})
		}
		m.groupOf[oi] = g
		m.groups[g].work += plannedWork(s, hr)
	}
	// Classes: groups by period, a new class whenever the period exceeds the class's first by more
	// than lockTolerance. Without packing every group is a class of its own.
	var known []int
	for g, t := range timings {
		if t.period > 0 {
			known = append(known, g)
		}
	}
	slices.SortStableFunc(known, func(a, b int) int { return cmp.Compare(timings[a].period, timings[b].period) })
	var horizon []time.Duration
	var first time.Duration
	for _, g := range known {
		P := timings[g].period
		if !m.packing || len(horizon) == 0 || float64(P) > float64(first)*(1+lockTolerance) {
			horizon = append(horizon, P)
			first = P
		}
		c := len(horizon) - 1
		horizon[c] = max(horizon[c], P)
		m.groups[g].class = c
	}
	m.classes = len(horizon)
	for g := range m.groups {
		gr, t := &m.groups[g], timings[g]
		if gr.class < 0 {
			gr.steady = 1 / max(t.burst, p.UnknownBurst).Seconds()
			continue
		}
		gr.dense = ringShape(t.period, t.phase, t.burst+time.Duration(p.DelayBudget*float64(t.period)), horizon[gr.class], now)
		if !m.packing {
			gr.dense = []float64{slices.Max(gr.dense)}
		}
		for i, y := range gr.dense {
			if y > 0 {
				gr.shape = append(gr.shape, slotLoad{int32(i), y})
				gr.sumY += y
				gr.sumY2 += y * y
				gr.peakY = max(gr.peakY, y)
			}
		}
	}
	return m
}

// ringShape lays the next burst of a shard (one core-second of work per step) onto a ring of
// profileSlots slots covering [now, now+horizon), wrapping its tail: cores per slot.
func ringShape(period, phase, burst, horizon time.Duration, now time.Time) []float64 {
	dense := make([]float64, profileSlots)
	delta := horizon.Seconds() / profileSlots
	bw := min(max(burst.Seconds(), delta), period.Seconds())
	// Offset of now into the cycle in integer nanoseconds, so that float rounding of large Unix
	// times does not move it.
	o := (now.UnixNano() - int64(phase)) % int64(period)
	if o < 0 {
		o += int64(period)
	}
	start := 0.0
	if o > 0 {
		start = (period - time.Duration(o)).Seconds()
	}
	xa, xb := start/delta, (start+bw)/delta
	for i := math.Floor(xa); i < xb; i++ {
		ov := min(xb, i+1) - max(xa, i)
		dense[int(i)%profileSlots] += ov / bw
	}
	return dense
}

// classStats are a ring's sum, sum of squares and peak over its slots.
type classStats struct{ sum, sumsq, peak float64 }

// classLoad is the load of one class on a runtime (or the pool). While one group holds it, its
// ring is that group's shape times w and is not materialized.
type classLoad struct {
	g    int
	w    float64
	ring []float64
	st   classStats
}

// load is the load of a set of shards: per class rings and the aggregates the demand formula needs.
type load struct {
	m       *model
	cls     []*classLoad // by class
	present []int        // classes with load, in the order they came
	mu, vr  float64      // mean and variance of the summed classes
	sumPeak float64
	excess  float64 // max over classes of peak - mean (an upper bound after adds; exact after removes)
	steady  float64
	demand  float64
}

func (m *model) newLoad() load { return load{m: m, cls: make([]*classLoad, m.classes)} }

func (m *model) meanVar(st classStats) (mu, vr float64) {
	S := float64(m.slots)
	mu = st.sum / S
	return mu, max(0, st.sumsq/S-mu*mu)
}

// combine is the demand formula (see the model at the top of the file).
func (m *model) combine(mu, vr, sumPeak, excess, steady float64) float64 {
	if !m.packing {
		return steady + sumPeak
	}
	return steady + min(sumPeak, max(mu+m.z*math.Sqrt(vr), mu+excess))
}

func (l *load) ringAt(cl *classLoad, slot int32) float64 {
	if cl.ring != nil {
		return cl.ring[slot]
	}
	return cl.w * l.m.groups[cl.g].dense[slot]
}

// after returns the stats of group gi's class once w more work of it is added.
func (l *load) after(gi int, w float64) classStats {
	g := &l.m.groups[gi]
	cl := l.cls[g.class]
	if cl == nil {
		return classStats{w * g.sumY, w * w * g.sumY2, w * g.peakY}
	}
	if cl.ring == nil && cl.g == gi {
		W := cl.w + w
		return classStats{W * g.sumY, W * W * g.sumY2, W * g.peakY}
	}
	dot, peak := 0.0, cl.st.peak
	for _, sl := range g.shape {
		x := l.ringAt(cl, sl.slot)
		dot += x * sl.load
		peak = max(peak, x+w*sl.load)
	}
	return classStats{cl.st.sum + w*g.sumY, cl.st.sumsq + 2*w*dot + w*w*g.sumY2, peak}
}

// demandAfter is the demand once w more work of group gi is added.
func (l *load) demandAfter(gi int, w float64) float64 {
	g := &l.m.groups[gi]
	if g.class < 0 {
		return l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady+w*g.steady)
	}
	var old classStats
	if cl := l.cls[g.class]; cl != nil {
		old = cl.st
	}
	st := l.after(gi, w)
	mu0, v0 := l.m.meanVar(old)
	mu1, v1 := l.m.meanVar(st)
	return l.m.combine(l.mu-mu0+mu1, l.vr-v0+v1, l.sumPeak-old.peak+st.peak, max(l.excess, st.peak-mu1), l.steady)
}

func (l *load) add(gi int, w float64) {
	g := &l.m.groups[gi]
	if g.class < 0 {
		l.steady += w * g.steady
		l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
		return
	}
	st := l.after(gi, w)
	cl := l.cls[g.class]
	var old classStats
	switch {
	case cl == nil:
		cl = &classLoad{g: gi, w: w}
		l.cls[g.class] = cl
		l.present = append(l.present, g.class)
	case cl.ring == nil && cl.g == gi:
		old = cl.st
		cl.w += w
	default:
		old = cl.st
		if cl.ring == nil {
			cl.ring = make([]float64, len(g.dense))
			for _, sl := range l.m.groups[cl.g].shape {
				cl.ring[sl.slot] = cl.w * sl.load
			}
		}
		for _, sl := range g.shape {
			cl.ring[sl.slot] += w * sl.load
		}
	}
	cl.st = st
	mu0, v0 := l.m.meanVar(old)
	mu1, v1 := l.m.meanVar(st)
	l.mu += mu1 - mu0
	l.vr += v1 - v0
	l.sumPeak += st.peak - old.peak
	l.excess = max(l.excess, st.peak-mu1)
	l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
}

func (l *load) remove(gi int, w float64) {
	g := &l.m.groups[gi]
	if g.class < 0 {
		l.steady = max(0, l.steady-w*g.steady)
		l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
		return
	}
	cl := l.cls[g.class]
	if cl == nil {
		return
	}
	if cl.ring == nil {
		if cl.g == gi {
			cl.w -= w
			cl.st = classStats{cl.w * g.sumY, cl.w * cl.w * g.sumY2, cl.w * g.peakY}
		}
	} else {
		for _, sl := range g.shape {
			cl.ring[sl.slot] = max(0, cl.ring[sl.slot]-w*sl.load)
		}
		cl.st = classStats{}
		for _, x := range cl.ring {
			cl.st.sum += x
			cl.st.sumsq += x * x
			cl.st.peak = max(cl.st.peak, x)
		}
	}
	if cl.st.peak <= eps {
		l.cls[g.class] = nil
		l.present = slices.DeleteFunc(l.present, func(c int) bool { return c == g.class })
	}
	l.mu, l.vr, l.sumPeak, l.excess = 0, 0, 0, 0
	for _, c := range l.present {
		st := l.cls[c].st
		mu, vr := l.m.meanVar(st)
		l.mu += mu
		l.vr += vr
		l.sumPeak += st.peak
		l.excess = max(l.excess, st.peak-mu)
	}
	l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
}
