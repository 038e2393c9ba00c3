// Package sim replays a training workload against the autoscaler's Decider in simulated time and
// reports what the pool would cost and how much it would slow the jobs down, against static peak
// provisioning per job.
package sim
