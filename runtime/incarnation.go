package runtime

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/wire"
)

// errStreamReplaced says that a job's stream was deleted and created again under the same name:
// the job was deleted and created again, and what an executor of the old incarnation would do
// there (consume, purge, publish a late snapshot) would corrupt the new one. It wraps
// jetstream.ErrStreamNotFound: for the old incarnation the stream is gone.
var errStreamReplaced = fmt.Errorf("%w: created again since this runtime opened it", jetstream.ErrStreamNotFound)

// streamRef is one stream of one job incarnation: its name, the time it was created and its first
// sequence (store.FirstSeq; 0 for a stream made before there was one).
type streamRef struct {
	stream  jetstream.Stream
	name    string
	created time.Time
	first   uint64
}

func newStreamRef(s jetstream.Stream) streamRef {
	info := s.CachedInfo()
	return streamRef{stream: s, name: info.Config.Name, created: info.Created, first: info.Config.FirstSeq}
}

// current returns nil if the stream is still the one it was, errStreamReplaced if it was created
// again, and the error of the look-up otherwise (jetstream.ErrStreamNotFound when it is gone).
func (ref streamRef) current(ctx context.Context) error {
	info, err := ref.stream.Info(ctx)
	if err != nil {
		return err
	}
	if !info.Created.Equal(ref.created) {
		return fmt.Errorf("stream %s: %w", ref.name, errStreamReplaced)
	}
	return nil
}

// namesAnother reports whether a snapshot's message id names an incarnation of the job other than
// ji's (wire.SnapshotIncarnation): a late message of an earlier one. An id that names none (an
// older runtime's) does not tell.
func (ji *jobInfo) namesAnother(m *jetstream.RawStreamMsg) bool {
	inc, ok := wire.SnapshotIncarnation(ji.rec.Spec.ID, m.Header.Get(wire.HdrMsgID))
	return ok && ji.inc != "" && inc != ji.inc
}

// current checks the streams of the shard's incarnation that it writes to or reads from: its
// gradient stream (none for direct gradients) and the parameter stream (current of each). A job
// with several gradient streams has the others checked by their own shards.
func (x *shardExec) current(ctx context.Context) error {
	if x.grads.stream != nil {
		if err := x.grads.current(ctx); err != nil {
			return err
		}
	}
	return x.ji.streams[len(x.ji.streams)-1].current(ctx)
}
