package autoscaler

import (
	"math"
	"time"
)

type sample struct {
	at     time.Time
	demand float64
}

// record adds a demand sample and forgets those older than both windows.
func (d *Decider) record(p Policy, now time.Time, demand float64) {
	keep := max(p.StableWindow, p.PanicWindow)
	i := 0
	for i < len(d.samples) && now.Sub(d.samples[i].at) >= keep {
		i++
	}
	d.samples = append(d.samples[i:], sample{now, demand})
}

// windowMax is the highest demand sampled within w before now.
func (d *Decider) windowMax(now time.Time, w time.Duration) float64 {
	m := 0.0
	for _, s := range d.samples {
		if now.Sub(s.at) < w || s.at.Equal(now) {
			m = max(m, s.demand)
		}
	}
	return m
}

// sized is the demand the pool is sized for in the current mode.
func (d *Decider) sized(p Policy, now time.Time) float64 {
	if d.panicking {
		return d.windowMax(now, p.PanicWindow)
	}
	return d.windowMax(now, p.StableWindow)
}

// scale applies the panic and stable rules and returns the number of healthy runtimes wanted, and
// whether max_runtimes capped it (the pool is short).
func (d *Decider) scale(p Policy, now time.Time, demand, held, capacity float64, healthy int, anyShards bool, say func(string, ...any)) (int, bool) {
	perRuntime := float64(p.CoresPerRuntime) * p.TargetUtilization
	need := func(x float64) int { return int(math.Ceil(x/perRuntime - eps)) }
	cur := d.target
	if !d.decided {
		cur = healthy
	}
	ratio := math.Inf(1)
	if capacity > 0 {
		ratio = demand / capacity
	} else if demand == 0 {
		ratio = 0
	}
	if ratio >= p.PanicThreshold {
		if !d.panicking {
			say("panic: demand %.2f cores >= %.1f x capacity %.2f", demand, p.PanicThreshold, capacity)
		}
		d.panicking = true
		d.lastPanic = now
	} else if d.panicking && now.Sub(d.lastPanic) >= p.PanicWindow {
		d.panicking = false
		say("panic over: demand %.2f cores < %.1f x capacity %.2f for %v", demand, p.PanicThreshold, capacity, p.PanicWindow)
	}

	var target int
	if d.panicking {
		peak := d.windowMax(now, p.PanicWindow)
		target = max(cur, need(peak))
		say("panic: sized for %.2f cores, the peak of the last %v; never scaling down", peak, p.PanicWindow)
	} else {
		peak := d.windowMax(now, p.StableWindow)
		want := need(peak)
		target = want
		since := now.Sub(d.lastChange)
		switch {
		case want > cur && d.decided && since < p.ScaleUpCooldown:
			target = cur
			say("scale-up cooldown: holding %d (want %d; last change %v ago < %v)", cur, want, since.Round(time.Millisecond), p.ScaleUpCooldown)
		case want < cur && d.decided && since < p.ScaleDownCooldown:
			target = cur
			say("scale-down cooldown: holding %d (want %d; last change %v ago < %v)", cur, want, since.Round(time.Millisecond), p.ScaleDownCooldown)
		case want < cur && need(held) >= cur:
			target = cur
			say("holding %d: the runtimes' own demands add up to %.2f cores (fragmentation)", cur, held)
		case want < cur:
			floor := max(want, need(held))
			step := max(1, int(math.Floor(float64(cur)*p.MaxScaleDownFraction+eps)))
			target = max(floor, cur-step)
			say("scale down %d -> %d (want %d, placement needs %d; at most %.0f%% per decision)", cur, target, want, need(held), 100*p.MaxScaleDownFraction)
		}
		if p.CoresPerRuntime == unknownCores {
			say("demand %.2f cores now, peak %.2f over the stable window %v: runtimes sized to their machine, none reports its cores yet: %d",
				demand, peak, p.StableWindow, want)
		} else {
			say("demand %.2f cores now, peak %.2f over the stable window %v: %d runtimes of %d cores at %.0f%%",
				demand, peak, p.StableWindow, want, p.CoresPerRuntime, 100*p.TargetUtilization)
		}
	}
	lo := p.MinRuntimes
	if anyShards {
		lo = max(lo, 1)
	}
	if target < lo {
		target = lo
		say("held at min_runtimes %d", p.MinRuntimes)
	}
	capped := target > p.MaxRuntimes
	if capped {
		say("capped at max_runtimes %d (wanted %d)", p.MaxRuntimes, target)
		target = p.MaxRuntimes
	}
	return target, capped
}

// grow asks for runtimes to hold the shards that fit nowhere (homeless: their demand, each counted
// alone), subject to the scale-up cooldown outside panic, and returns the healthy runtimes wanted,
// and whether max_runtimes capped them (the pool is short).
func (d *Decider) grow(p Policy, now time.Time, homeless float64, target, healthy int, say func(string, ...any)) (int, bool) {
	if homeless <= eps {
		return target, false
	}
	extra := int(math.Ceil(homeless/(float64(p.CoresPerRuntime)*p.TargetUtilization) - eps))
	capped := healthy+extra > p.MaxRuntimes
	want := min(healthy+extra, p.MaxRuntimes)
	switch {
	case want <= target:
	case !d.panicking && d.decided && now.Sub(d.lastChange) < p.ScaleUpCooldown:
		say("shards needing %.2f cores fit on no runtime; scale-up cooldown holds %d", homeless, target)
	default:
		say("shards needing %.2f cores fit on no runtime: %d -> %d runtimes", homeless, target, want)
		target = want
	}
	return target, capped
}

// commit records the healthy runtimes wanted, and when that number last changed.
func (d *Decider) commit(now time.Time, target, healthy int) {
	prev := d.target
	if !d.decided {
		prev = healthy // the first decision starts from the observed pool
	}
	if target != prev {
		d.lastChange = now
	}
	d.target, d.decided = target, true
}
