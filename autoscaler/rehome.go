package autoscaler

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/wire"
)

// A job with several gradient streams (spec gradient_streams) keeps each on one node's server,
// and placement serves the stream's shards on the runtimes connected to that server, so that each
// gradient crosses the network once. When a server that had runtimes has had none taking shards
// for homelessAfter (its node's runtimes drained, scaled in or lost while the server runs on, or
// connected to another server since this one restarted), the leader moves each of its gradient
// streams to the server with runtimes that leads the fewest of that job's streams (then the fewest
// of all jobs'): JetStream adds a peer there, catches it up, moves the stream's consumers and
// drops the old peer, the stream taking gradients throughout (store.MoveStream). The shards then
// follow their stream to its new server's runtimes.
//
// Only a server this leader has seen with runtimes counts as having lost them: at a cold start,
// or after a pool-wide outage, servers whose runtimes are not up yet keep their streams. A server
// is a target only once a stream the gateway placed by node tag, with no move under way, is led by
// it: that is how the leader knows which tag reaches it (a client cannot see a server's tags).
// Streams of several replicas, and those of paused jobs, stay where they are. A move is not fenced
// like the leader's writes to the buckets: a deposed leader's move still goes to a server with
// runtimes, and JetStream refuses a second one while the first is under way.
const (
	homelessAfter = 30 * time.Second
	moveBudget    = time.Second     // for the moves asked in one decision; the rest wait for the next
	moveRetry     = 5 * time.Second // after JetStream said an earlier reconfiguration is under way
)

// rehoming is what rehome keeps between decisions; only Step reads and writes it.
type rehoming struct {
	term   uint64               // the leader term it was gathered in: a new term starts afresh
	hosted map[string]time.Time // server -> when it last had a runtime taking shards
	next   map[string]time.Time // stream -> the earliest time to ask for its move again
	warned map[string]bool      // streams whose failed move was logged as a warning
}

// JetStream's refusals of a stream update while an earlier move or reconfiguration of the stream
// is under way (nats-server's JSStreamMoveInProgress, JSStreamReconfigureInProgress).
const (
	errMoveInProgress        jetstream.ErrorCode = 10124
	errReconfigureInProgress jetstream.ErrorCode = 10226
)

func underWay(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == errMoveInProgress || apiErr.ErrorCode == errReconfigureInProgress)
}

// rehome moves the gradient streams of servers that have lost their runtimes for homelessAfter
// (see above); term is the leader term of the decision, leaders what streamLeaders learnt.
func (c *Controller) rehome(ctx context.Context, term uint64, snap view.Snapshot, obs Observations, leaders map[string]string, now time.Time) {
	r := &c.rehoming
	if r.term != term || r.hosted == nil {
		*r = rehoming{term: term, hosted: map[string]time.Time{}, next: map[string]time.Time{}, warned: map[string]bool{}}
	}
	for _, rt := range obs.Runtimes {
		if rt.Server != "" && !rt.Draining {
			r.hosted[rt.Server] = now
		}
	}
	hosting := func(server string) bool { return r.hosted[server].Equal(now) }

	// Which tag reaches which server: from the streams placed by one node tag, led there, with no
	// move under way; a server two such streams disagree on is left out.
	tagOf, ambiguous := map[string]string{}, map[string]bool{}
	for _, l := range c.leaders {
		if l.tag == "" || l.server == "" || l.replicas > 1 || l.moving {
			continue
		}
		if t, ok := tagOf[l.server]; ok && t != l.tag {
			ambiguous[l.server] = true
		}
		tagOf[l.server] = l.tag
	}
	var targets []string
	for server := range tagOf {
		if hosting(server) && !ambiguous[server] {
			targets = append(targets, server)
		}
	}
	slices.Sort(targets)
	led := map[string]int{} // gradient streams of any job, per server
	for id, rec := range snap.Jobs {
		if n := rec.Spec.GradStreams(); n > 1 {
			for g := range n {
				led[leaders[wire.GradGroupStream(id, g)]]++
			}
		}
	}

	ctx, cancel := context.WithTimeout(ctx, moveBudget)
	defer cancel()
	due := map[string]bool{}
	for _, id := range sortedKeys(snap.Jobs) {
		rec := snap.Jobs[id]
		n := rec.Spec.GradStreams()
		if n <= 1 || rec.Paused {
			continue
		}
		held := map[string]int{} // the job's streams per server
		for g := range n {
			held[leaders[wire.GradGroupStream(id, g)]]++
		}
		for g := range n {
			name := wire.GradGroupStream(id, g)
			l := c.leaders[name]
			last, seen := r.hosted[l.server]
			if l.server == "" || l.replicas > 1 || !seen || now.Sub(last) < homelessAfter {
				continue // not known, not movable, at home, or not away for long
			}
			due[name] = true
			if len(targets) == 0 || now.Before(r.next[name]) || ctx.Err() != nil {
				continue
			}
			to := targets[0]
			for _, s := range targets[1:] {
				if held[s] < held[to] || held[s] == held[to] && led[s] < led[to] {
					to = s
				}
			}
			r.next[name] = now.Add(homelessAfter)
			delete(c.leaders, name) // ask where it is at the next decision
			moved, err := store.MoveStream(ctx, c.js, name, tagOf[to])
			switch {
			case underWay(err):
				r.next[name] = now.Add(moveRetry)
				c.log.Debug("a gradient stream's earlier move is under way", "job", id, "stream", name, "err", err)
			case err != nil:
				say := c.log.Warn
				if r.warned[name] {
					say = c.log.Debug // said once: its server may be down for good
				}
				r.warned[name] = true
				say("could not move a gradient stream off a server with no runtime", "job", id, "stream", name,
					"server", l.server, "to", to, "err", err)
			case moved:
				delete(r.warned, name)
				held[l.server]--
				held[to]++
				led[l.server]--
				led[to]++
				c.log.Info("moving a gradient stream to a server with runtimes", "job", id, "stream", name,
					"from", l.server, "to", to, "tag", tagOf[to], "runtimes_gone_for", now.Sub(last).Round(time.Second))
			}
		}
	}
	for name := range r.next {
		if !due[name] {
			delete(r.next, name) // at home again, or its job is gone
			delete(r.warned, name)
		}
	}
}
