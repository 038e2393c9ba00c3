package wire

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Reason is a stable, machine-readable code for why an input was rejected.
type Reason string

// The one table of rejection reasons. Runtime, gateway and SDK all speak these codes; docs/PROTOCOL.md
// lists them. Add to the end; never change a code's meaning.
const (
	ReasonMissingHeader Reason = "missing_header" // a required header is absent
	ReasonBadHeader     Reason = "bad_header"     // a header is present but malformed
	ReasonBadDtype      Reason = "bad_dtype"      // an element type fanin does not accept
	ReasonUnknownJob    Reason = "unknown_job"    // no such job (no stream answered the publish)
	ReasonUnknownShard  Reason = "unknown_shard"  // the shard id is not in the job's layout
	ReasonRankRange     Reason = "rank_out_of_range"
	ReasonBadLength     Reason = "bad_length" // payload shorter than the shard, or not whole elements
	ReasonOversized     Reason = "oversized"  // payload longer than the shard, or over the server's limit
	ReasonStaleStep     Reason = "stale_step" // the step was already applied
	ReasonFutureStep    Reason = "future_step"
	ReasonDuplicate     Reason = "duplicate"  // this rank already sent this step
	ReasonNonFinite     Reason = "non_finite" // NaN or Inf in a job that forbids them

	// Credentials, quotas and the control plane (gateway API). docs/API.md lists them.

	ReasonUnauthorized    Reason = "unauthorized"           // no credentials, or credentials fanin does not accept
	ReasonForbidden       Reason = "forbidden"              // valid credentials that do not reach this job, subject or route
	ReasonQuotaExceeded   Reason = "quota_exceeded"         // a quota of the job or of its owner's token
	ReasonInvalidSpec     Reason = "invalid_spec"           // a job spec that does not decode or validate
	ReasonUnknownFunction Reason = "unknown_function"       // the spec names a function fanin does not have
	ReasonBadHyper        Reason = "bad_hyper"              // a hyper-parameter is unknown, missing or out of range
	ReasonBodyTooLarge    Reason = "body_too_large"         // a request body over the gateway's limit
	ReasonTooDeep         Reason = "too_deep"               // a request body nested deeper than the gateway accepts
	ReasonMediaType       Reason = "unsupported_media_type" // a Content-Type the route does not take
	ReasonInvalidPolicy   Reason = "invalid_policy"         // an autoscaler policy that does not decode or validate
	ReasonBadParameter    Reason = "bad_parameter"          // a malformed path or query parameter
	ReasonStorageFull     Reason = "storage_full"           // the NATS servers are out of JetStream storage
	ReasonBadBeat         Reason = "bad_beat"               // an elastic worker's beat: too large, unparsable, or a field out of bounds
	ReasonBeatRate        Reason = "beat_rate"              // beats beyond the rate a worker or job may send
	ReasonBadModule       Reason = "bad_module"             // an uploaded function module fanin refuses (docs/FUNCTIONS.md)
	ReasonFunctionFailed  Reason = "function_failed"        // a user function failed a step: trap, time or memory limit, NaN output
)

// Reasons lists every reason with a one-line description, in table order.
var Reasons = []struct {
	Code Reason
	Text string
}{
	{ReasonMissingHeader, "a required header (Fanin-Step, Fanin-Rank, Fanin-Dtype) is absent"},
	{ReasonBadHeader, "a header is present but malformed"},
	{ReasonBadDtype, "the element type is not supported"},
	{ReasonUnknownJob, "no job with that id exists"},
	{ReasonUnknownShard, "the shard id is not in the job's layout"},
	{ReasonRankRange, "the rank is not in 0..N-1"},
	{ReasonBadLength, "the payload is not exactly the shard's elements"},
	{ReasonOversized, "the payload is larger than the shard or than the server accepts"},
	{ReasonStaleStep, "the step was already applied"},
	{ReasonFutureStep, "the step is further ahead than the sync mode allows"},
	{ReasonDuplicate, "this rank already sent a gradient for this shard and step"},
	{ReasonNonFinite, "the payload holds NaN or Inf and the job forbids them"},
	{ReasonUnauthorized, "no credentials, or an API token or NATS credentials fanin does not accept"},
	{ReasonForbidden, "the credentials are valid but do not reach this job, subject or route"},
	{ReasonQuotaExceeded, "a quota of the job or of its owner's token is exhausted"},
	{ReasonInvalidSpec, "the job spec does not decode or does not validate"},
	{ReasonUnknownFunction, "the spec names an aggregation function fanin does not have"},
	{ReasonBadHyper, "a hyper-parameter is unknown, missing or out of range"},
	{ReasonBodyTooLarge, "the request body is larger than the gateway accepts"},
	{ReasonTooDeep, "the request body is nested deeper than the gateway accepts"},
	{ReasonMediaType, "the Content-Type is not one the route accepts"},
	{ReasonInvalidPolicy, "the autoscaler policy does not decode or does not validate"},
	{ReasonBadParameter, "a path or query parameter is malformed"},
	{ReasonStorageFull, "the NATS servers are out of JetStream storage: nothing was stored; retry once space is freed"},
	{ReasonBadBeat, "an elastic worker's beat is too large, does not decode, or has a field out of bounds"},
	{ReasonBeatRate, "an elastic worker or job sent beats faster than fanin takes them"},
	{ReasonBadModule, "an uploaded function module is too large, not WebAssembly, imports what fanin does not serve, or breaks the function ABI"},
	{ReasonFunctionFailed, "a user function failed a step (a trap, its time or memory limit, an error, a non-finite output): the step is not applied and the shard is unchanged"},
}

// DataPlaneReasons is how many rows at the head of Reasons are about gradient messages
// (docs/PROTOCOL.md); the rest are about credentials, quotas and the API (docs/API.md).
const DataPlaneReasons = 12

// KnownReason reports whether r is in the table.
func KnownReason(r Reason) bool {
	for _, x := range Reasons {
		if x.Code == r {
			return true
		}
	}
	return false
}

// Reject is one rejected input: the reason, a specific human explanation, and where it came from.
type Reject struct {
	Reason Reason `json:"reason"`
	Detail string `json:"detail"`
	Job    string `json:"job,omitempty"`
	Shard  int    `json:"shard"`
	Step   int64  `json:"step,omitempty"`
	Rank   int    `json:"rank"`
	MsgID  string `json:"msg_id,omitempty"` // the rejected message's Nats-Msg-Id, if it had one
	// Pause is set by a runtime whose user function failed the shard's step too many times in a
	// row (function_failed): the gateway pauses the job.
	Pause bool `json:"pause,omitempty"`
}

// Rejectf makes a Reject with a formatted detail; the caller fills in where it came from.
func Rejectf(r Reason, format string, args ...any) *Reject {
	return &Reject{Reason: r, Detail: fmt.Sprintf(format, args...), Shard: -1, Rank: -1}
}

func (r *Reject) Error() string {
	return fmt.Sprintf("rejected (%s): %s", r.Reason, r.Detail)
}

// Is makes errors.Is(err, &Reject{Reason: X}) match any rejection with reason X.
func (r *Reject) Is(target error) bool {
	t, ok := target.(*Reject)
	return ok && t.Reason == r.Reason && t.Detail == ""
}

// ErrReason is a target for errors.Is: errors.Is(err, wire.ErrReason(wire.ReasonStaleStep)).
func ErrReason(r Reason) error { return &Reject{Reason: r} }

// Marshal encodes the report sent to a sender's Fanin-Reply-To and to RejectsSubject.
func (r *Reject) Marshal() []byte {
	b, _ := json.Marshal(r) // a struct of strings and ints always marshals
	return b
}

// ReplyMsg is the report of the rejection to the sender of the input, at subject (its HdrReplyTo,
// or the reply inbox of a request): the JSON report, its reason also in HdrReject.
func (r *Reject) ReplyMsg(subject string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(HdrReject, string(r.Reason))
	m.Data = r.Marshal()
	return m
}

// ReportMsg is the rejection as published for observers on its job's RejectsSubject (r.Job must
// be set): the JSON report, its reason in HdrReject, and who made it with that origin's cumulative
// counts for the job (HdrRejectOrigin; HdrRejectCounts, as RejectTally.Add or FormatCounts make
// them).
func (r *Reject) ReportMsg(origin, counts string) *nats.Msg {
	m := r.ReplyMsg(RejectsSubject(r.Job))
	m.Header.Set(HdrRejectOrigin, origin)
	m.Header.Set(HdrRejectCounts, counts)
	return m
}

// UnmarshalReject decodes a rejection report.
func UnmarshalReject(b []byte) (*Reject, error) {
	var r Reject
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode rejection report: %w", err)
	}
	if r.Reason == "" {
		return nil, fmt.Errorf("decode rejection report: no reason in %q", b)
	}
	return &r, nil
}
