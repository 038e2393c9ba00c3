// Package sim replays a training workload against the autoscaler's Decider in simulated time and
// reports what the whole service (runtimes and NATS broker, at the CPU per byte fanin bench
// measured) would cost per GB of gradient summed in completed steps, and how much it would slow
// the jobs down, against per-job parameter servers, static provisioning and a realistic oracle.
package sim
