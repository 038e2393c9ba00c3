package wire

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Message building. Every message fanin stores (parameters, checkpoints, uploaded initial
// parameters) has its subject, headers and de-duplication id made here, by runtime, store, SDK and
// bench alike; so do gradients (GradMsg, next to their parser in headers.go) and rejection reports
// (Reject.ReplyMsg and ReportMsg). docs/PROTOCOL.md describes what they are. Checkpoints and
// uploads are always f32; parameters are f32, or the job's 16-bit param_dtype after step 0
// (gradients may be 16-bit: see dtype.go).

// CheckpointMsgID is the de-duplication id of one shard's checkpoint after one step, in the
// job's incarnation inc (Incarnation; "" leaves it out).
func CheckpointMsgID(job, inc string, shard int, step int64) string {
	return snapshotMsgID(job, ".c.", inc, shard, step)
}

// SetParamsHeaders fills the headers of a parameters message: the step it follows, the last
// gradient sequence folded in, its dtype, and its message id (in the job's incarnation inc). A
// reused message keeps its header slices (no allocation but the id's string).
func SetParamsHeaders(h nats.Header, job, inc string, shard int, step int64, seq uint64, dt Dtype) {
	setSnapshotHeaders(h, step, seq, dt)
	set(h, HdrMsgID, ParamsMsgID(job, inc, shard, step))
}

// ParamsDtype checks that a parameters message is elems elements of the dtype its HdrDtype names
// (f32 when absent) and returns that dtype. A dtype it does not know, or a payload of another
// length, is an error naming both.
func ParamsDtype(h nats.Header, data []byte, elems int) (Dtype, error) {
	dt := F32
	if v := first(h, HdrDtype); v != "" {
		var ok bool
		if dt, ok = ParseDtype(v); !ok {
			return F32, fmt.Errorf("parameters: %s %q, want %s, %s or %s", HdrDtype, v, DtypeF32, DtypeBF16, DtypeF16)
		}
	}
	if want := elems * dt.ElemSize(); len(data) != want {
		return dt, fmt.Errorf("parameters: %d bytes, want %d (%d %s elements)", len(data), want, elems, dt)
	}
	return dt, nil
}

// DecodeParams decodes the payload of a parameters message into dst (the shard's elements) by its
// HdrDtype, once ParamsDtype accepts it, and returns that dtype.
func DecodeParams(dst []float32, h nats.Header, data []byte) (Dtype, error) {
	dt, err := ParamsDtype(h, data, len(dst))
	if err != nil {
		return dt, err
	}
	Decode(dst, data, dt)
	return dt, nil
}

// SetCheckpointHeaders fills the headers of a checkpoint message, as SetParamsHeaders with the
// checkpoint's message id (always f32). Sync-mode headers (HdrReplayFrom, HdrStepSeqs,
// HdrRankSteps, HdrApplied) are the caller's.
func SetCheckpointHeaders(h nats.Header, job, inc string, shard int, step int64, seq uint64) {
	setSnapshotHeaders(h, step, seq, F32)
	set(h, HdrMsgID, CheckpointMsgID(job, inc, shard, step))
}

func setSnapshotHeaders(h nats.Header, step int64, seq uint64, dt Dtype) {
	set(h, HdrStep, strconv.FormatInt(step, 10))
	set(h, HdrSeq, strconv.FormatUint(seq, 10))
	set(h, HdrDtype, dt.String())
}

// ParamsMsg is a parameters message of one shard after step (data: its f32 little-endian bytes),
// of the job's incarnation inc (Incarnation).
func ParamsMsg(job, inc string, shard int, step int64, seq uint64, data []byte) *nats.Msg {
	m := nats.NewMsg(ParamsSubject(job, shard))
	SetParamsHeaders(m.Header, job, inc, shard, step, seq, F32)
	m.Data = data
	return m
}

// InitMsg is the upload of one shard's initial parameters (step 0, f32, its InitMsgID).
func InitMsg(job string, shard int, data []byte) *nats.Msg {
	m := nats.NewMsg(InitSubject(job, shard))
	m.Header.Set(HdrStep, "0")
	m.Header.Set(HdrDtype, DtypeF32)
	m.Header.Set(HdrMsgID, InitMsgID(job, shard))
	m.Data = data
	return m
}

// set is h.Set(k, v) reusing the value slice of a header set before.
func set(h nats.Header, k, v string) {
	if s := h[k]; len(s) == 1 {
		s[0] = v
		return
	}
	h[k] = []string{v}
}
