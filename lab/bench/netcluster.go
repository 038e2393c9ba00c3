package bench

import (
	"fmt"

	"github.com/fanin-ml/fanin/job"
)

// The cluster scenario measures fanin where the network, not the CPU, is the limit: a cluster of
// clusterWorkers worker nodes emulated with network namespaces (netLab), each node's link capped
// at clusterMbit each way, and PyTorch's gloo ring all-reduce on the same links as the baseline,
// alternated with fanin in the same run. Every process runs on its node (ip netns exec): the
// nats-server processes, the runtime processes (`fanin bench-runtime`), one worker process per
// worker node holding one rank (`fanin bench-workers`), or one gloo.py rank per worker node. Only
// the gateway and the autoscaler, idle while the job steps, run in this process, connected to a
// node's NATS server from inside that node's namespace. Each measurement holds every worker
// process after its warm-up, reads every link's counters and every process's CPU, releases them,
// and reads them again when the last one ends: the figures are those of the timed steps alone.

// clusterLayout is where fanin's service runs.
type clusterLayout int

const (
	// onServiceNode: one nats-server and clusterServiceRuntimes runtimes on a node of their own,
	// the workers connected to that server over their links.
	onServiceNode clusterLayout = iota
	// spreadOverWorkers: a nats-server (one cluster) and a runtime on every worker node, no other
	// node; each worker connected to its own node's server.
	spreadOverWorkers
)

// clusterCase is one fanin configuration of the cluster scenario.
type clusterCase struct {
	name   string
	layout clusterLayout
	link   int  // onServiceNode: the service node's link rate, in multiples of a worker's
	bf16   bool // bf16 gradients (sdk.WithGradDtype) and parameters (param_dtype: bf16)
	// spec, if set, changes the job's spec: a data-plane mode that a spec field selects is one
	// more case, e.g. {name: "spread,direct", layout: spreadOverWorkers, spec: func(s *job.Spec)
	// { s.Gradients = "direct" }, goal: 1}.
	spec func(*job.Spec)
	// embedded: each node's NATS server runs in a runtime's process (`fanin runtime
	// --nats-config`), which it connects to in-process; otherwise a nats-server process of its own.
	embedded bool
	goal     float64 // the goal for the ratio to gloo's steps/s, 0 for none
}

// clusterCases run in this order, gloo once before each pair of them (cases 0, 2, 4, ...).
var clusterCases = []clusterCase{
	{name: "service node,1x link", layout: onServiceNode, link: 1},
	{name: "service node,1x link,bf16", layout: onServiceNode, link: 1, bf16: true},
	{name: "service node,4x link", layout: onServiceNode, link: 4, goal: 1},
	{name: "service node,4x link,bf16", layout: onServiceNode, link: 4, bf16: true, goal: 2.3},
	{name: "spread", layout: spreadOverWorkers, goal: 1},
	{name: "spread,bf16", layout: spreadOverWorkers, bf16: true, goal: 1.8},
	// Direct gradients (PROTOCOL.md) go from a worker's server to the runtime's without a stream:
	// no node holds all of a job's gradients, so spread, each byte crosses the network once.
	{name: "spread,direct", layout: spreadOverWorkers, spec: directGradients, goal: 1},
	{name: "spread,direct,bf16", layout: spreadOverWorkers, bf16: true, spec: directGradients, goal: 1.8},
	// Stored gradients in a stream per worker node (spec gradient_streams), each shard served on
	// its stream's node: as with direct gradients, each gradient byte crosses the network once.
	{name: "spread,streams", layout: spreadOverWorkers, spec: nodeStreams, goal: 1},
	{name: "spread,streams,bf16", layout: spreadOverWorkers, bf16: true, spec: nodeStreams, goal: 1.8},
	// Each node's NATS server in a runtime's process (the service node's in the first of its
	// runtimes, the other two connected over loopback): nothing between them crosses the kernel.
	{name: "spread,direct,embedded", layout: spreadOverWorkers, spec: directGradients, embedded: true, goal: 1},
	{name: "service node,4x link,bf16,embedded", layout: onServiceNode, link: 4, bf16: true, embedded: true, goal: 2.3},
}

// directGradients makes a job send its gradients to the runtimes as core NATS requests.
func directGradients(s *job.Spec) { s.Gradients = job.GradientsDirect }

// nodeStreams keeps a job's gradients in one stream per worker node.
func nodeStreams(s *job.Spec) { s.GradientStreams = clusterWorkers }

const (
	clusterWorkers  = 4
	clusterMbit     = 100
	clusterElements = quickElements // 2.56M float32: 10.2 MB
	// 24 shards: as many on each of the 4 worker nodes, and on each of the 3 service runtimes.
	// A node sends a shard's parameters to the other n-1 nodes only once the shard's last
	// gradient is in, so each step ends with (n-1) shards' worth on its link after the last
	// gradient: the smaller the shard, the shorter that tail (12 shards: 0.90-0.93x gloo, 24:
	// 0.95-0.97x, 48: 0.91-0.94x, where the messages' own costs take over; spread, direct, f32).
	clusterShardSize       = 440000
	clusterServiceRuntimes = e2eRuntimes
	clusterNATSPort        = 4222
	clusterRoutePort       = 6222
	clusterGlooPort        = 29500
	glooRingBaseline       = "PyTorch gloo ring all-reduce + SGD (gloo.py), one rank per worker node, on the same links"
)

// bytesTheory is what a case's links should carry per step (BytePS's analysis).
type bytesTheory struct {
	name                string
	workerIn, workerOut float64
	serviceNote         string
}

// ringTheory is a ring all-reduce's bytes per node and step, each way, in float32.
func ringTheory(w workload) float64 {
	n := float64(w.Ranks)
	return 2 * (n - 1) / n * 4 * float64(w.Elements)
}

// clusterTheory: with the service on its own node a worker sends its gradient (S_g) and receives
// the parameters (S_p), the service node receives n S_g and sends n S_p; spread over the n worker
// nodes, each node's share of the service receives and sends 1/n of it, so a node sends and
// receives (n-1)/n (S_g + S_p): a ring's 2(n-1)/n S in float32.
func clusterTheory(c clusterCase, w workload) bytesTheory {
	width := 4.0
	if c.bf16 {
		width = 2
	}
	sg, sp := width*float64(w.Elements), width*float64(w.Elements)
	n := float64(w.Ranks)
	if c.layout == spreadOverWorkers {
		v := (n - 1) / n * (sg + sp)
		return bytesTheory{name: "spread: (n-1)/n (S_g + S_p) each way", workerIn: v, workerOut: v}
	}
	return bytesTheory{name: "parameter service: S_p in, S_g out per worker", workerIn: sp, workerOut: sg,
		serviceNote: fmt.Sprintf(", service node %.1f/%.1f MB", n*sg/1e6, n*sp/1e6)}
}
