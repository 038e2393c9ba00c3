// Package autoscaler decides where shards run. Today it holds the static placer, the single writer of
// placement: it spreads each job's shards over the live runtimes and moves shards off runtimes that
// stopped heart-beating. The elastic decider replaces it in a later step.
package autoscaler
