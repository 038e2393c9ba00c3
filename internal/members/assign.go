// Package members keeps the membership of elastic jobs: which physical workers are alive (their
// beats, wire.WorkerBeat) and which logical ranks each holds (wire.Assignment). The autoscaler
// leader runs it; docs/PROTOCOL.md ("Elastic workers") has the protocol.
package members

import (
	"slices"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/wire"
)

// Member is one live worker as the tracker knows it.
type Member struct {
	Beat   wire.WorkerBeat
	Joined time.Time // first beat seen
	Last   time.Time // last beat seen

	bucket *rate.Bucket // its beats (wire.WorkerBeatRate)
}

// Assign computes the assignment of ranks logical ranks to the live workers, in the order they
// joined (then by id), changing as little as possible from prev (nil: none).
//
// The first min(target, ranks) workers hold ranks (target 0: every worker, up to ranks); the rest
// stand by. Ranks are spread evenly: with n active workers, each holds ranks/n, and the first
// ranks%n one more. A worker keeps the ranks it held in prev up to its share, lowest first; the
// ranks freed (by workers gone, standing by or above their share) go to the workers below their
// share, in join order, lowest rank first. The epoch grows by one when any rank changes hands.
func Assign(jobID string, ranks, target int, live []Member, prev *wire.Assignment, now time.Time) *wire.Assignment {
	live = slices.Clone(live)
	slices.SortStableFunc(live, func(a, b Member) int {
		if c := a.Joined.Compare(b.Joined); c != 0 {
			return c
		}
		return strings.Compare(a.Beat.ID, b.Beat.ID)
	})
	n := len(live)
	if target > 0 {
		n = min(n, target)
	}
	n = min(n, ranks)
	held := map[string][]int{}
	var prevEpoch uint64
	if prev != nil {
		prevEpoch = prev.Epoch
		for _, w := range prev.Workers {
			held[w.ID] = w.Ranks
		}
	}
	out := &wire.Assignment{Job: jobID, Epoch: prevEpoch, Target: target, Updated: now.UTC()}
	taken := make([]bool, ranks)
	share := func(i int) int {
		s := ranks / n
		if i < ranks%n {
			s++
		}
		return s
	}
	for i, m := range live {
		w := wire.AssignedWorker{
			ID: m.Beat.ID, Host: m.Beat.Host, PID: m.Beat.PID, Step: m.Beat.Step,
			Joined: m.Joined.UTC(), LastBeat: m.Last.UTC(), Ranks: []int{},
		}
		if i >= n {
			w.Standby = true
		} else {
			keep := slices.Clone(held[m.Beat.ID])
			slices.Sort(keep)
			for _, r := range keep {
				if len(w.Ranks) == share(i) {
					break
				}
				if r >= 0 && r < ranks && !taken[r] {
					taken[r] = true
					w.Ranks = append(w.Ranks, r)
				}
			}
		}
		out.Workers = append(out.Workers, w)
	}
	next := 0
	for i := range n {
		w := &out.Workers[i]
		for len(w.Ranks) < share(i) {
			for taken[next] {
				next++
			}
			taken[next] = true
			w.Ranks = append(w.Ranks, next)
		}
		slices.Sort(w.Ranks)
	}
	if n == 0 {
		for r := range ranks {
			out.Unassigned = append(out.Unassigned, r)
		}
	}
	if prev == nil || !sameOwners(prev, out) {
		out.Epoch = prevEpoch + 1
	}
	return out
}

// sameOwners reports whether a and b give every rank to the same worker.
func sameOwners(a, b *wire.Assignment) bool {
	owners := func(x *wire.Assignment) map[int]string {
		m := map[int]string{}
		for _, w := range x.Workers {
			for _, r := range w.Ranks {
				m[r] = w.ID
			}
		}
		return m
	}
	oa, ob := owners(a), owners(b)
	if len(oa) != len(ob) {
		return false
	}
	for r, id := range oa {
		if ob[r] != id {
			return false
		}
	}
	return true
}
