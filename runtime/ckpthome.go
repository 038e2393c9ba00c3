package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/wire"
)

// Node checkpoints. A direct-gradients shard whose parameters message is no snapshot (bf16
// parameters, an optimizer with state) checkpoints after every step (direct.go, rule 2), and so
// does a stored one with bf16 parameters; those of a job with several gradient streams, placed on
// the runtimes' nodes, are kept on the nodes as a direct job's are. In the
// job's one parameter stream, every such checkpoint crossed the network to the node of the
// stream's server: spread over a cluster, that node received a checkpoint of every shard served
// elsewhere each step (f32, twice the bytes of bf16 parameters). So a runtime writes these
// checkpoints to a stream of the job on its own node, NodeCkptStream, placed by the JetStream tag
// wire.NodeTag(node) that the node's servers carry (server_tags), one replica: its checkpoints
// stay on the node. A runtime whose node has no server with the tag, or whose job has more than
// one replica, writes them to the parameter stream as before.
//
// A shard's newest snapshot is then the newest checkpoint of any of those streams: a new owner
// reads the parameter stream's checkpoint and each node stream's of this incarnation of the job
// (lastCkpt) and restores the one of the highest step. Steps only grow, so an older checkpoint
// left on a node the shard moved away from is never taken for the newest. A node stream that
// does not answer fails the restore (the executor tries again) rather than let an older
// checkpoint be restored.

// ckptIncarnation is the metadata key of a node checkpoint stream that names the incarnation of
// its job (the parameter stream's creation time): a stream of an earlier job of the same id is
// neither written nor read.
const ckptIncarnation = "fanin.params.created"

// ckptHome returns the token of the job's checkpoint stream on the runtime's node, creating the
// stream if it does not exist: "" when the job's checkpoints go to its parameter stream (above).
// The answer is kept for the job's incarnation.
func (r *Runtime) ckptHome(ctx context.Context, ji *jobInfo) string {
	ji.homeMu.Lock()
	defer ji.homeMu.Unlock()
	if ji.homeKnown {
		return ji.homeTok
	}
	rec := ji.rec
	if !ji.nodeCkpts() || rec.Spec.Replicas > 1 {
		ji.homeKnown = true
		return ""
	}
	node, _ := r.where()
	if node == "" {
		return "" // not connected: ask again at the next restore
	}
	id := rec.Spec.ID
	incarnation := ji.paramsCreated()
	cfg := nodeCkptConfig(ji, node)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := r.js.CreateStream(cctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		st, err = r.js.Stream(cctx, cfg.Name)
	}
	switch {
	case err != nil && cctx.Err() != nil:
		return "" // ask again at the next restore
	case err != nil:
		r.log.Info("checkpoints stay in the parameter stream: no stream on the runtime's node", "job", id, "node", node, "tag", wire.NodeTag(node), "err", err)
	case st.CachedInfo().Config.Metadata[ckptIncarnation] != incarnation:
		r.log.Info("checkpoints stay in the parameter stream: the node's stream is another incarnation's", "job", id, "stream", cfg.Name)
	default:
		ji.homeTok = wire.NodeToken(node)
	}
	ji.homeKnown = true
	return ji.homeTok
}

// nodeCkptKeep is how many checkpoints of a shard a node stream keeps: the shard's newest, and
// one more so that a late checkpoint of an earlier incarnation's runtime (foreignSnapshot says
// how one lands) does not replace the shard's own, which lastCkpt then restores.
const nodeCkptKeep = 2

// nodeCkptConfig is the configuration of the job's checkpoint stream on node (ckptHome).
func nodeCkptConfig(ji *jobInfo, node string) jetstream.StreamConfig {
	rec := ji.rec
	storage := jetstream.MemoryStorage
	if rec.Spec.Storage == "file" {
		storage = jetstream.FileStorage
	}
	return jetstream.StreamConfig{
		Name:              wire.NodeCkptStream(rec.Spec.ID, node),
		Description:       "fanin checkpoints of job " + rec.Spec.ID + " written on node " + node,
		Subjects:          []string{wire.NodeCkptWildcard(rec.Spec.ID, node)},
		Storage:           storage,
		Replicas:          1,
		MaxMsgsPerSubject: nodeCkptKeep,
		Placement:         &jetstream.Placement{Tags: []string{wire.NodeTag(node)}},
		Metadata:          map[string]string{ckptIncarnation: ji.paramsCreated()},
	}
}

// paramsCreated is the creation time of the incarnation's parameter stream, as a string.
func (ji *jobInfo) paramsCreated() string {
	ref := ji.streams[len(ji.streams)-1] // the parameter stream is the last (newJobInfo)
	return strconv.FormatInt(ref.created.UnixNano(), 10)
}

// useCkptHome points the shard's checkpoints at the job's stream on the runtime's node, if it
// has one (ckptHome), once no checkpoint is in flight.
func (x *shardExec) useCkptHome(ctx context.Context) error {
	if x.ckptBuf == nil || !x.ji.nodeCkpts() {
		return nil
	}
	tok := x.r.ckptHome(ctx, x.ji)
	if tok == "" {
		return nil
	}
	for !x.ckptBusy.CompareAndSwap(false, true) { // an asynchronous checkpoint owns the buffer
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-x.ckptFree:
		case <-time.After(5 * time.Millisecond):
		}
	}
	x.ckptBuf.msg.Subject = wire.NodeCkptSubject(x.ji.rec.Spec.ID, tok, x.shard.ID)
	x.ckptBusy.Store(false)
	return nil
}

// nodeCkpts reports whether the job may keep checkpoints on the nodes that write them: a
// direct-gradients job, and a job with several gradient streams (each on a node, so that the
// shards' bytes stay there: their checkpoints should too).
func (ji *jobInfo) nodeCkpts() bool { return ji.rec.Spec.DirectGradients() || len(ji.grads) > 1 }

// lastCkpt returns the shard's newest checkpoint: its parameter stream's, and for a job whose
// checkpoints may be on nodes (nodeCkpts) the newest of those in the job's node checkpoint streams
// of this incarnation; nil if there is none.
func (x *shardExec) lastCkpt(ctx context.Context) (*jetstream.RawStreamMsg, error) {
	id := x.ji.rec.Spec.ID
	ck, err := lastFromLeader(ctx, x.r.nc, wire.ParamsStream(id), wire.CkptSubject(id, x.shard.ID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		ck, err = nil, nil
	}
	if err != nil || !x.ji.nodeCkpts() || x.ckptBuf == nil {
		return ck, err
	}
	prefix, incarnation := wire.NodeCkptStreamPrefix(id), x.ji.paramsCreated()
	names := x.r.js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.NodeCkptFilter(id)))
	var list []string
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) {
			list = append(list, name)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("list the node checkpoint streams of job %s: %w", id, err)
	}
	for _, name := range list {
		st, err := x.r.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", name, err)
		}
		if st.CachedInfo().Config.Metadata[ckptIncarnation] != incarnation {
			continue
		}
		m, err := x.nodeCkpt(ctx, st, wire.NodeCkptSubject(id, strings.TrimPrefix(name, prefix), x.shard.ID))
		if err != nil {
			return nil, err
		}
		if m != nil && (ck == nil || snapStep(m) > snapStep(ck)) {
			ck = m
		}
	}
	return ck, nil
}

// nodeCkpt returns the shard's newest checkpoint of this incarnation in node stream st, on
// subject; nil if there is none.
func (x *shardExec) nodeCkpt(ctx context.Context, st jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	name := st.CachedInfo().Config.Name
	for {
		m, err := lastFromLeader(ctx, x.r.nc, name, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil || !x.ji.namesAnother(m) {
			return m, err
		}
		// A late checkpoint of an earlier incarnation's runtime (foreignSnapshot says how one
		// lands) in this incarnation's stream: never this shard's snapshot. The stream keeps the
		// shard's own beside it (nodeCkptKeep), read once this one is gone.
		x.log.Warn("a checkpoint of an earlier incarnation of the job is in its node stream; deleting it",
			"stream", name, "stream_seq", m.Sequence, "step", snapStep(m))
		if err := st.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("delete a checkpoint of an earlier incarnation from %s: %w", name, err)
		}
	}
}
