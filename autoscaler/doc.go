// Package autoscaler sizes the runtime pool and places shards: a pure Decider (observations and
// now in, a decision out; the simulator reuses it unchanged), the Controller that runs it as the
// leader of a control loop and carries its decisions out, and the pool drivers.
package autoscaler
