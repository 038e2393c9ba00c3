package telemetry

import "go.opentelemetry.io/otel/attribute"

// Span names. One trace per (job, step):
//
//	fanin.step                      rank 0's worker: the step, from its publish to its receipt (root)
//	└ fanin.worker.step             each rank's worker: Step, from publish to the new parameters
//	  ├ fanin.worker.publish        the rank's gradients of every shard, until JetStream acked them
//	  │ └ fanin.shard.invoke        the runtime's invocation of one shard for the step (child of the
//	  │   │                         first rank whose gradient arrived; linked to the other ranks)
//	  │   ├ fanin.shard.queue_wait  the completing gradient, from stored in JetStream to folded
//	  │   ├ fanin.shard.gather      the ranks, from the first stored to the last folded in rank order
//	  │   ├ fanin.shard.function    the aggregation function
//	  │   └ fanin.shard.publish     the new parameters, until JetStream acked them
//	  │     └ fanin.worker.receive  each rank's worker receiving the shard's parameters
//	  └ fanin.worker.fetch          parameters fetched from the stream after a missed push
const (
	SpanStep          = "fanin.step"
	SpanWorkerStep    = "fanin.worker.step"
	SpanWorkerPublish = "fanin.worker.publish"
	SpanWorkerReceive = "fanin.worker.receive"
	SpanWorkerFetch   = "fanin.worker.fetch"
	SpanInvoke        = "fanin.shard.invoke"
	SpanQueueWait     = "fanin.shard.queue_wait"
	SpanGather        = "fanin.shard.gather"
	SpanFunction      = "fanin.shard.function"
	SpanPublish       = "fanin.shard.publish"
)

// Attribute keys.
const (
	AttrJob      = attribute.Key("fanin.job")
	AttrShard    = attribute.Key("fanin.shard")
	AttrShards   = attribute.Key("fanin.shards")
	AttrStep     = attribute.Key("fanin.step")
	AttrRank     = attribute.Key("fanin.rank")
	AttrRanks    = attribute.Key("fanin.ranks")
	AttrLastRank = attribute.Key("fanin.last_rank") // the rank whose gradient completed the gather
	AttrBytes    = attribute.Key("fanin.bytes")
	AttrFunction = attribute.Key("fanin.function")
	AttrRuntime  = attribute.Key("fanin.runtime")
	AttrEpoch    = attribute.Key("fanin.epoch")
	AttrSubject  = attribute.Key("messaging.destination.name")
	AttrSystem   = attribute.Key("messaging.system")
)
