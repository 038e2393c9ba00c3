package wire

import (
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// Subjects. Every subject of a job lives under fanin.v1.<job>; a job id never contains a dot.
//
//	fanin.v1.<job>.grad.<shard>    gradients, workers -> runtime (stream GRAD_<job>)
//	fanin.v1.<job>.params.<shard>  parameters after each step, runtime -> workers (stream PARAMS_<job>)
//	fanin.v1.<job>.ckpt.<shard>    shard checkpoints, runtime -> runtime (stream PARAMS_<job>)
//	fanin.v1.<job>.nckpt.<node>.<shard>  direct-gradient jobs: checkpoints kept on the node of the
//	                               runtime that wrote them, runtime -> runtime (stream CKPT_<job>_<node>)
//	fanin.v1.<job>.init.<shard>    initial parameters of an init "upload" job, worker -> runtime (stream INIT_<job>), once
//	fanin.v1.<job>.resend.<shard>  direct-gradient jobs: "send your gradients again from step s", runtime -> workers (core NATS)
//	fanin.v1.<job>.rejects         rejected inputs, runtime -> observers (core NATS, not stored)
//	fanin.v1.<job>.inbox.>         the job's reply namespace: its workers' inboxes (InboxPrefix)
const Prefix = "fanin.v1."

// GradSubject is where rank gradients for one shard are published.
func GradSubject(job string, shard int) string { return shardSubject(job, ".grad.", shard) }

// ParamsSubject is where the parameters of one shard are published after every step.
func ParamsSubject(job string, shard int) string { return shardSubject(job, ".params.", shard) }

// CkptSubject holds the latest checkpoint of one shard (parameters and optimizer state).
func CkptSubject(job string, shard int) string { return shardSubject(job, ".ckpt.", shard) }

// InitSubject is where a worker of an init "upload" job publishes one shard's initial parameters,
// once: the runtime that serves the shard checks them and publishes them as the step-0 parameters.
func InitSubject(job string, shard int) string { return shardSubject(job, ".init.", shard) }

// InitSubjects lists the upload subject of each of a job's shards 0..shards-1. A job's upload
// stream binds exactly these, not InitWildcard: an upload to a shard the job does not have finds
// no stream ("no responders") and is never stored, so it cannot take the place of a real shard's.
func InitSubjects(job string, shards int) []string {
	out := make([]string, shards)
	for i := range out {
		out[i] = InitSubject(job, i)
	}
	return out
}

// InitWildcard matches the initial parameters of every shard of a job.
func InitWildcard(job string) string { return Prefix + job + ".init.*" }

// InitStream is the JetStream stream that keeps the uploaded initial parameters of an init "upload"
// job: one message per shard, written once.
func InitStream(job string) string { return "FANIN_INIT_" + job }

// InboxPrefix is the inbox prefix of a job's worker connections (nats.CustomInboxPrefix, `nats
// --inbox-prefix`), and the job's reply namespace: fanin publishes to a subject a client chose
// (Fanin-Reply-To) only below it (ValidReplyTo).
func InboxPrefix(job string) string { return Prefix + job + ".inbox" }

// InboxWildcard matches every subject of a job's reply namespace.
func InboxWildcard(job string) string { return InboxPrefix(job) + ".>" }

// ValidReplyTo reports whether subject is one fanin may publish a reply to for job: a literal
// subject (no wildcards, no empty tokens, no white space) of at most 256 bytes inside the job's
// reply namespace.
func ValidReplyTo(job, subject string) bool {
	prefix := InboxPrefix(job) + "."
	if len(subject) <= len(prefix) || len(subject) > 256 || subject[:len(prefix)] != prefix {
		return false
	}
	prev := byte('.')
	for i := len(prefix); i < len(subject); i++ {
		c := subject[i]
		switch {
		case c == '*' || c == '>' || c <= ' ' || c == 0x7f:
			return false
		case c == '.' && prev == '.':
			return false
		}
		prev = c
	}
	return prev != '.'
}

// RejectsSubject carries every rejection of the job's inputs, for observers.
func RejectsSubject(job string) string { return Prefix + job + ".rejects" }

// ResendSubject is where the runtime that takes over a shard of a direct-gradient job (spec
// gradients: direct) asks the workers to send their gradients again, from the step in its
// HdrStep: the gradients it received before were in memory only.
func ResendSubject(job string, shard int) string { return shardSubject(job, ".resend.", shard) }

// ResendWildcard matches the resend notices of every shard of a job.
func ResendWildcard(job string) string { return Prefix + job + ".resend.*" }

// GradWildcard matches the gradients of every shard of a job.
func GradWildcard(job string) string { return Prefix + job + ".grad.*" }

// ParamsWildcard matches the parameters of every shard of a job.
func ParamsWildcard(job string) string { return Prefix + job + ".params.*" }

// CkptWildcard matches the checkpoints of every shard of a job.
func CkptWildcard(job string) string { return Prefix + job + ".ckpt.*" }

// NodeCkptStream is the stream that keeps, on one node, the checkpoints that the runtimes there
// write of a direct-gradients job's shards (placed by the JetStream tag NodeTag(node)).
func NodeCkptStream(job, node string) string { return NodeCkptStreamPrefix(job) + NodeToken(node) }

// NodeCkptStreamPrefix starts the name of every NodeCkptStream of a job.
func NodeCkptStreamPrefix(job string) string { return "FANIN_CKPT_" + job + "_" }

// NodeCkptSubject holds the latest checkpoint that a runtime on the node of token tok (NodeToken)
// wrote of one shard.
func NodeCkptSubject(job, tok string, shard int) string {
	return Prefix + job + ".nckpt." + tok + "." + strconv.Itoa(shard)
}

// NodeCkptWildcard matches the node checkpoints of every shard of a job on one node.
func NodeCkptWildcard(job, node string) string {
	return Prefix + job + ".nckpt." + NodeToken(node) + ".*"
}

// NodeCkptFilter matches every node checkpoint of a job.
func NodeCkptFilter(job string) string { return Prefix + job + ".nckpt.>" }

// NodeTag is the JetStream server tag (server_tags) that marks the servers of a node: a node's
// checkpoint stream is placed on a server that carries it.
func NodeTag(node string) string { return "fanin-node:" + strings.ToLower(node) }

// NodeToken is a node's name as a subject token and a stream name's part: letters, digits, '-'
// and '_' kept, anything else (or nothing) changes it to '_' and appends a hash of the name, so
// that two names never share a token.
func NodeToken(node string) string {
	clean := node != ""
	b := []byte(node)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i], clean = '_', false
		}
	}
	if clean {
		return node
	}
	h := fnv.New32a()
	h.Write([]byte(node))
	return string(b) + "-" + strconv.FormatUint(uint64(h.Sum32()), 16)
}

// GradStream is the JetStream stream that stores a job's gradients, or with several gradient
// streams (spec gradient_streams > 1) the prefix of their names: see GradStreamOf.
func GradStream(job string) string { return "FANIN_GRAD_" + job }

// GradStreamOf is the stream that stores shard's gradients of a job whose gradients are kept in
// streams streams: with one, GradStream(job); with more, GradStream(job) + "_" + the shard's group,
// shard mod streams. A job id has no '_', so no other job's stream has such a name.
func GradStreamOf(job string, streams, shard int) string {
	if streams <= 1 {
		return GradStream(job)
	}
	return GradGroupStream(job, shard%streams)
}

// GradGroupStream is the stream of group g of a job with several gradient streams.
func GradGroupStream(job string, g int) string { return GradStream(job) + "_" + strconv.Itoa(g) }

// GradGroupSubjects are the gradient subjects of the shards of group g of a job of shards shards
// kept in streams streams: g, g+streams, g+2*streams, ...
func GradGroupSubjects(job string, streams, g, shards int) []string {
	out := make([]string, 0, (shards-g+streams-1)/streams)
	for s := g; s < shards; s += streams {
		out = append(out, GradSubject(job, s))
	}
	return out
}

// ParamsStream is the JetStream stream that keeps the latest parameters and checkpoint per shard.
func ParamsStream(job string) string { return "FANIN_PARAMS_" + job }

// Buckets of JetStream key-value state shared by the components.
const (
	JobsBucket      = "fanin-jobs"      // key <job>: the job record (spec and layout), JSON
	PlacementBucket = "fanin-placement" // key <job>.<shard>: the runtime that owns the shard, JSON
	RuntimesBucket  = "fanin-runtimes"  // key <runtime id>: a runtime's registration and heartbeat, JSON
)

// PlacementKey is the key of one shard in PlacementBucket.
func PlacementKey(job string, shard int) string { return job + "." + strconv.Itoa(shard) }

// ShardFromSubject returns the shard id at the end of a grad/params/ckpt subject.
func ShardFromSubject(subject string) (int, bool) {
	i := len(subject)
	for i > 0 && subject[i-1] != '.' {
		i--
	}
	n, err := strconv.Atoi(subject[i:])
	if err != nil || n < 0 || (len(subject)-i > 1 && subject[i] == '0') {
		return 0, false
	}
	return n, true
}

func shardSubject(job, kind string, shard int) string {
	return Prefix + job + kind + strconv.Itoa(shard)
}

// Placement is the value of a PlacementBucket entry: which runtime owns the shard, since which epoch.
type Placement struct {
	Runtime string `json:"runtime"`
	Epoch   uint64 `json:"epoch"`
	From    string `json:"from,omitempty"` // the previous owner, which must release the shard first
	// Term is the leadership term of the autoscaler that wrote the entry (the leader lock's
	// revision when taken): every write is fenced by it (see docs/FAULTS.md).
	Term uint64 `json:"term,omitempty"`
}

// RuntimeInfo is the value of a RuntimesBucket entry, refreshed by the runtime's heartbeat.
type RuntimeInfo struct {
	ID      string    `json:"id"`
	Cores   int       `json:"cores"`
	Started time.Time `json:"started"`
	Beat    time.Time `json:"beat"`
	// Lapse is how long after this heartbeat the runtime asks to be taken for alive without
	// another (nanoseconds; zero or absent: the default, 5 s). A runtime whose heartbeats are
	// acknowledged late, behind a full link, asks for more (store.LapseFor), 10 s at most.
	Lapse time.Duration `json:"lapse,omitempty"`
	// Metrics is the URL of the runtime's Prometheus endpoint, when it serves one; the gateway
	// lists them for Prometheus's HTTP service discovery (GET /v1/metrics/targets).
	Metrics string `json:"metrics,omitempty"`
}

// StreamSeq returns the stream sequence of a JetStream message from its ack reply subject, without
// allocating. See AckInfo.
func StreamSeq(reply string) (uint64, bool) {
	seq, _, ok := AckInfo(reply)
	return seq, ok
}

// AckInfo returns the stream sequence and the consumer's pending count from a JetStream message's
// ack reply subject, without allocating. Both forms are accepted:
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]
func AckInfo(reply string) (seq, pending uint64, ok bool) {
	const prefix = "$JS.ACK."
	if len(reply) < len(prefix) || reply[:len(prefix)] != prefix {
		return 0, 0, false
	}
	tokens := 1
	for i := 0; i < len(reply); i++ {
		if reply[i] == '.' {
			tokens++
		}
	}
	var seqPos int
	switch {
	case tokens == 9:
		seqPos = 5
	case tokens >= 11:
		seqPos = 7
	default:
		return 0, 0, false
	}
	pendPos := seqPos + 3
	start, tok := 0, 0
	for i := 0; i <= len(reply); i++ {
		if i == len(reply) || reply[i] == '.' {
			switch tok {
			case seqPos:
				n, good := parseInt(reply[start:i])
				if !good {
					return 0, 0, false
				}
				seq = uint64(n)
			case pendPos:
				n, good := parseInt(reply[start:i])
				if !good {
					return 0, 0, false
				}
				return seq, uint64(n), true
			}
			tok++
			start = i + 1
		}
	}
	return 0, 0, false
}

// DirectGetLast is the JetStream direct-get subject that answers with the newest message of subject
// in stream (the subject form: no request body). A job's workers reach only their own job's.
func DirectGetLast(stream, subject string) string {
	return "$JS.API.DIRECT.GET." + stream + "." + subject
}

// DirectGet is the JetStream direct-get subject of stream for requests with a JSON body (by
// sequence, last for a subject up to a sequence, ...).
func DirectGet(stream string) string { return "$JS.API.DIRECT.GET." + stream }

// JobRecordGet is the direct-get subject that answers with a job's record, the newest value of key
// <job> in JobsBucket.
func JobRecordGet(job string) string {
	return DirectGetLast("KV_"+JobsBucket, "$KV."+JobsBucket+"."+job)
}

// AssignmentGet is the direct-get subject that answers with a job's Assignment, the newest value
// of key <job> in AssignBucket.
func AssignmentGet(job string) string {
	return DirectGetLast("KV_"+AssignBucket, "$KV."+AssignBucket+"."+job)
}
