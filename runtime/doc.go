// Package runtime is a fanin runtime: one process that hosts the shard executors placed on it, pulls
// their gradients from JetStream, applies the aggregation function, publishes parameters, and
// checkpoints so that nothing accepted is lost or applied twice.
package runtime
