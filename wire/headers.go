package wire

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Header names. NATS headers are case-sensitive: send them spelled exactly so.
const (
	HdrStep    = "Fanin-Step"     // gradients: the step they belong to (1, 2, ...); params: the step they follow (0 = initial)
	HdrRank    = "Fanin-Rank"     // gradients: the logical rank 0..N-1
	HdrDtype   = "Fanin-Dtype"    // element type of the payload: "f32", or for gradients "bf16" or "f16", for parameters after step 0 "bf16" (dtype.go)
	HdrWeight  = "Fanin-Weight"   // gradients of weighted functions (fedavg): the rank's weight, e.g. its sample count
	HdrReplyTo = "Fanin-Reply-To" // gradients: a subject where a rejection of this message is reported
	HdrSeq     = "Fanin-Seq"      // params and checkpoints: the last gradient stream sequence folded in
	HdrMsgID   = nats.MsgIdHdr    // "Nats-Msg-Id": de-duplication by JetStream
	HdrReject  = "Fanin-Reject"   // rejection reports: the reason code
	// HdrVersion (gradients of ssp and asp jobs): the step of the shard's parameters the gradient
	// was computed from (0 = initial).
	HdrVersion = "Fanin-Version"
	// Snapshots of ssp shards: the lowest stream sequence of a gradient accepted and not yet
	// applied (replay starts there), and "step:seq" of the steps the ring keeps.
	HdrReplayFrom = "Fanin-Replay-From"
	HdrStepSeqs   = "Fanin-Step-Seqs"
	// Snapshots of asp shards: every rank's last applied step, comma-separated in rank order.
	HdrRankSteps = "Fanin-Rank-Steps"
	// Parameters of asp shards: "<rank>.<step>" of the gradient that made this version.
	HdrApplied = "Fanin-Applied"
)

// Headroom is what a message needs beyond its payload for subject, headers and protocol framing.
// A NATS server must allow max_payload >= shard bytes + Headroom.
const Headroom = 64 << 10

// GradMsgID is the de-duplication id of one rank's gradient for one shard and step.
func GradMsgID(job string, shard int, step int64, rank int) string {
	return GradAttemptMsgID(job, shard, step, rank, 0)
}

// ParamsMsgID is the de-duplication id of one shard's parameters after one step, in the job's
// incarnation inc (Incarnation; "" leaves it out).
func ParamsMsgID(job, inc string, shard int, step int64) string {
	return snapshotMsgID(job, ".p.", inc, shard, step)
}

// Incarnation names one creation of a job, by its record's Created time, in the message ids of
// what runtimes publish: a late message of a deleted job's runtime may land in the streams of the
// job created again under the same id, and JetStream would drop the new incarnation's message of
// the same step as a duplicate of it for two minutes. A checkpoint so dropped is acknowledged
// all the same, and the gradients it covers are purged: they would be lost.
func Incarnation(created time.Time) string {
	if created.IsZero() {
		return ""
	}
	return strconv.FormatInt(created.UnixNano(), 36)
}

// SnapshotIncarnation returns the incarnation that a parameters or checkpoint message id of job
// names (ParamsMsgID, CheckpointMsgID), and whether it names one: an id made without one (by a
// runtime of before incarnations, or of a record with no creation time) does not.
func SnapshotIncarnation(job, id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, job+".")
	if !ok {
		return "", false
	}
	tok := strings.Split(rest, ".")
	if len(tok) != 4 || tok[0] != "p" && tok[0] != "c" || tok[3] == "" {
		return "", false
	}
	return tok[3], true
}

func snapshotMsgID(job, kind, inc string, shard int, step int64) string {
	id := job + kind + strconv.Itoa(shard) + "." + strconv.FormatInt(step, 10)
	if inc != "" {
		id += "." + inc
	}
	return id
}

// InitMsgID is the de-duplication id of one shard's uploaded initial parameters.
func InitMsgID(job string, shard int) string { return job + ".i." + strconv.Itoa(shard) }

// GradAttemptMsgID is the de-duplication id of one try of a rank's gradient: GradMsgID for the
// first (attempt 0), and with the suffix ".a<attempt>" for a step the sender tries again after a
// failure. A retry's new id keeps JetStream from dropping it as the failed try's duplicate, and
// tells the sender which try a rejection (its msg_id) answers; GradAttempt reads it back.
func GradAttemptMsgID(job string, shard int, step int64, rank, attempt int) string {
	var buf [96]byte // one allocation, the string's, for a job id of up to some 40 bytes
	b := append(append(buf[:0], job...), ".g."...)
	b = append(strconv.AppendInt(b, int64(shard), 10), '.')
	b = append(strconv.AppendInt(b, step, 10), '.')
	b = strconv.AppendInt(b, int64(rank), 10)
	if attempt > 0 {
		b = strconv.AppendInt(append(b, ".a"...), int64(attempt), 10)
	}
	return string(b)
}

// GradAttempt is the retry number in a gradient message id made by GradAttemptMsgID: the k of an
// attempt suffix ".a<k>"; ids without one are attempt 0.
func GradAttempt(msgID string) int {
	i := len(msgID)
	for i > 0 && msgID[i-1] != '.' {
		i--
	}
	if i < len(msgID)-1 && msgID[i] == 'a' {
		if n, ok := parseInt(msgID[i+1:]); ok {
			return int(n)
		}
	}
	return 0
}

// The range of HdrWeight. A rank's input is scaled by float32(weight), and the sum by
// float32(1/sum of the weights): a weight beyond float32's range would scale it by Inf, and one
// below its smallest normal number by 0 (or a sum of them by Inf), and turn finite gradients into
// Inf or NaN parameters.
const (
	MinWeight = 0x1p-126        // float32's smallest normal number, about 1.18e-38
	MaxWeight = math.MaxFloat32 // about 3.40e38
)

// Grad is one gradient message as its sender makes it: GradMsg builds it, SetGradHeaders sets its
// headers in a message reused from step to step; ParseGradHeaders and GradAttempt read them back.
type Grad struct {
	Job   string
	Shard int   // the shard's id in the job's layout
	Step  int64 // >= 1
	Rank  int   // the logical rank, 0..ranks-1
	Dtype Dtype // the payload's element type; the zero value is F32
	// Weight is the rank's weight for weighted functions (HdrWeight), in MinWeight..MaxWeight; 0
	// sends none (weight 1).
	Weight float64
	// Version is the step of the parameters the gradient was computed from (HdrVersion, which ssp
	// and asp jobs require); sent only when Versioned.
	Version   int64
	Versioned bool
	ReplyTo   string // where fanin reports a rejection of the message (HdrReplyTo); "" sends none
	Attempt   int    // the sender's try of this step: its message id is GradAttemptMsgID
}

// GradMsg is the gradient message g with payload data: the shard's elements in g.Dtype,
// little-endian.
func GradMsg(g Grad, data []byte) *nats.Msg {
	m := nats.NewMsg(GradSubject(g.Job, g.Shard))
	SetGradHeaders(m.Header, g)
	m.Data = data
	return m
}

// SetGradHeaders sets the headers of gradient message g in h, its message id included, and
// removes the optional ones g does not send. A reused message keeps its header slices, and a
// header whose value did not change costs nothing: from one step to the next, the step's string
// (beyond 99) and the id's are all it allocates.
func SetGradHeaders(h nats.Header, g Grad) {
	setInt(h, HdrStep, g.Step)
	setInt(h, HdrRank, int64(g.Rank))
	set(h, HdrDtype, g.Dtype.String())
	if g.Weight != 0 {
		var buf [32]byte
		b := strconv.AppendFloat(buf[:0], g.Weight, 'g', -1, 64)
		if v := h[HdrWeight]; len(v) != 1 || v[0] != string(b) {
			set(h, HdrWeight, string(b))
		}
	} else {
		delete(h, HdrWeight)
	}
	if g.Versioned {
		setInt(h, HdrVersion, g.Version)
	} else {
		delete(h, HdrVersion)
	}
	if g.ReplyTo != "" {
		set(h, HdrReplyTo, g.ReplyTo)
	} else {
		delete(h, HdrReplyTo)
	}
	set(h, HdrMsgID, GradAttemptMsgID(g.Job, g.Shard, g.Step, g.Rank, g.Attempt))
}

// setInt is set(h, k, n in decimal), allocating only when the header's value changes.
func setInt(h nats.Header, k string, n int64) {
	var buf [20]byte
	b := strconv.AppendInt(buf[:0], n, 10)
	if v := h[k]; len(v) == 1 && v[0] == string(b) {
		return
	}
	set(h, k, string(b))
}

// GradMeta is what a gradient message's headers say.
type GradMeta struct {
	Step    int64   // 0 when HdrStep is absent or malformed
	Rank    int     // -1 when HdrRank is absent or malformed
	Weight  float64 // 1 unless HdrWeight is set
	ReplyTo string
	Version int64 // HdrVersion, -1 when absent
	Dtype   Dtype // HdrDtype: the payload's element type
}

// ParseGradHeaders reads and checks the headers of a gradient message. It allocates nothing but
// its rejection. Step and rank are read whatever else is wrong, so that a rejection names the
// sender's rank and step whenever they parse; a rejection reports the first problem in the order
// step, rank, dtype, weight, version. A number is canonical decimal of at most 18 digits: a
// longer one (say 2^64+1) is a bad header quoted as sent, never clamped or wrapped.
func ParseGradHeaders(h nats.Header) (GradMeta, *Reject) {
	m := GradMeta{Rank: -1, Weight: 1, Version: -1}
	if h == nil {
		return m, Rejectf(ReasonMissingHeader, "message has no headers; %s, %s and %s are required", HdrStep, HdrRank, HdrDtype)
	}
	m.ReplyTo = first(h, HdrReplyTo)
	var rej *Reject
	step := first(h, HdrStep)
	switch n, ok := parseInt(step); {
	case step == "":
		rej = Rejectf(ReasonMissingHeader, "header %s is missing", HdrStep)
	case !ok || n < 1:
		rej = Rejectf(ReasonBadHeader, "header %s: %q is not a step number >= 1%s", HdrStep, step, tooLong(step))
	default:
		m.Step = n
	}
	rank := first(h, HdrRank)
	if r, ok := parseInt(rank); ok && r <= math.MaxInt32 {
		m.Rank = int(r)
	}
	switch {
	case rej != nil: // the step's problem is the one reported, with the rank that sent it
	case rank == "":
		rej = Rejectf(ReasonMissingHeader, "header %s is missing", HdrRank)
	case m.Rank < 0:
		rej = Rejectf(ReasonBadHeader, "header %s: %q is not a rank number >= 0", HdrRank, rank)
	}
	if rej != nil {
		return m, rej
	}
	dt := first(h, HdrDtype)
	if dt == "" {
		return m, Rejectf(ReasonMissingHeader, "header %s is missing", HdrDtype)
	}
	var ok bool
	if m.Dtype, ok = ParseDtype(dt); !ok {
		return m, Rejectf(ReasonBadDtype, "header %s: %q is not supported (%q, %q or %q)", HdrDtype, dt, DtypeF32, DtypeBF16, DtypeF16)
	}
	if w := first(h, HdrWeight); w != "" {
		f, err := strconv.ParseFloat(w, 64)
		if err != nil || !(f >= MinWeight && f <= MaxWeight) {
			return m, Rejectf(ReasonBadHeader, "header %s: %q is not a weight in %g..%g (a float32 > 0, not subnormal)", HdrWeight, w, MinWeight, MaxWeight)
		}
		m.Weight = f
	}
	if v := first(h, HdrVersion); v != "" {
		n, ok := parseInt(v)
		if !ok {
			return m, Rejectf(ReasonBadHeader, "header %s: %q is not a step number >= 0%s", HdrVersion, v, tooLong(v))
		}
		m.Version = n
	}
	return m, nil
}

// tooLong explains a number refused for its length alone: all digits, canonical, but beyond what
// parseInt reads (a step or version past 10^18).
func tooLong(s string) string {
	if len(s) <= maxDigits || s[0] == '0' {
		return ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return ""
		}
	}
	return " (out of range: at most 18 digits)"
}

// CheckPayload checks a gradient payload of dt against a shard of elems elements: its length must
// be elems*dt.ElemSize() (ReasonOversized when longer and whole elements, ReasonBadLength otherwise), and with finite
// it must hold no NaN or Inf (ReasonNonFinite). The details name the dtype and the bytes expected.
func CheckPayload(data []byte, dt Dtype, elems, shard int, finite bool) *Reject {
	want := elems * dt.ElemSize()
	switch {
	case len(data)%dt.ElemSize() != 0:
		return Rejectf(ReasonBadLength, "payload is %d bytes, not whole %s elements (%d bytes each); shard %d holds %d %s elements (%d bytes)", len(data), dt, dt.ElemSize(), shard, elems, dt, want)
	case len(data) > want:
		return Rejectf(ReasonOversized, "payload is %d bytes, shard %d holds %d %s elements (%d bytes)", len(data), shard, elems, dt, want)
	case len(data) < want:
		return Rejectf(ReasonBadLength, "payload is %d bytes, shard %d holds %d %s elements (%d bytes)", len(data), shard, elems, dt, want)
	}
	if finite {
		if i := NonFinite(data, dt); i >= 0 {
			return Rejectf(ReasonNonFinite, "element %d (%s) of shard %d is NaN or Inf and the job does not allow them", i, dt, shard)
		}
	}
	return nil
}

// ParseStep reads HdrStep of a params or checkpoint message.
func ParseStep(h nats.Header) (int64, error) {
	s := first(h, HdrStep)
	n, ok := parseInt(s)
	if !ok || n < 0 {
		return 0, fmt.Errorf("header %s: %q is not a step number", HdrStep, s)
	}
	return n, nil
}

// ParseSeq reads HdrSeq of a params or checkpoint message.
func ParseSeq(h nats.Header) (uint64, error) {
	s := first(h, HdrSeq)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("header %s: %q is not a stream sequence", HdrSeq, s)
	}
	return n, nil
}

// maxDigits is the longest number parseInt reads: every 18-digit number fits an int64.
const maxDigits = 18

func first(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseInt accepts a number in canonical decimal only: digits, no sign, no spaces, no leading
// zero (one number, one spelling, as in message ids), at most maxDigits digits.
func parseInt(s string) (int64, bool) {
	if len(s) == 0 || len(s) > maxDigits || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
