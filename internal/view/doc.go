// Package view is the one read-side view of fanin's shared state: the jobs, placement, runtime
// registrations and elastic workers' assignments as their buckets hold them, and the runtimes'
// latest load reports with each shard's and job's steps/s. The autoscaler, the gateway and the
// dashboard read it, each through its own filters, so that they agree on what they see, on
// liveness and on speed.
package view
