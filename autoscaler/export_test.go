package autoscaler

import (
	"context"
	"time"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/view"
)

// SetRegistryCheck replaces how c tells whether the runtime registry takes heartbeats.
func SetRegistryCheck(c *Controller, check func(context.Context) bool) { c.registryCheck = check }

// SetRenewHook sets what runs before each renewal of c's leader lock.
func SetRenewHook(c *Controller, hook func(context.Context)) { c.renewHook = hook }

// Renew renews c's leader lock once, as its renewal goroutine does.
func Renew(c *Controller, ctx context.Context) { c.renew(ctx) }

// Term is the term c leads in (zero when it does not).
func Term(c *Controller) store.Term {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term
}

// Snapshot is c's view of the shared state.
func Snapshot(c *Controller) view.Snapshot { return c.view.Snapshot() }

// LeaseFor is how long after a renewal began a leader acts without another.
const LeaseFor = leaseFor

// StreamLeaders is what c learns, at now, of which server leads each job's parameter stream and
// gradient streams, by stream name.
func StreamLeaders(c *Controller, ctx context.Context, snap view.Snapshot, now time.Time) map[string]string {
	return c.streamLeaders(ctx, snap, now)
}

// LeaderRefresh is how long c trusts what it learnt of a parameter stream's leader.
const LeaderRefresh = leaderRefresh

// MaxViewLag is the most of its view's lag that the controller takes off the runtimes' ages.
const MaxViewLag = maxViewLag

// Rehome is what c does, at now and in leader term 1, about the gradient streams of servers that
// have lost their runtimes.
func Rehome(c *Controller, ctx context.Context, snap view.Snapshot, obs Observations, leaders map[string]string, now time.Time) {
	c.rehome(ctx, 1, snap, obs, leaders, now)
}

// HomelessAfter is how long a gradient stream's server has no live runtime before c moves it.
const HomelessAfter = homelessAfter
