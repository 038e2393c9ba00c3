package wire

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestStreamSeq(t *testing.T) {
	cases := map[string]uint64{
		"$JS.ACK.GRAD.cons.1.4711.12.1700000000000000000.0":               4711,
		"$JS.ACK.dom.ACCHASH.GRAD.cons.1.42.12.1700000000000000000.0.tok": 42,
		"$JS.ACK._.ACCHASH.GRAD.cons.1.7.12.1700000000000000000.0":        7,
	}
	for reply, want := range cases {
		if got, ok := StreamSeq(reply); !ok || got != want {
			t.Errorf("StreamSeq(%q) = %d, %v; want %d", reply, got, ok, want)
		}
	}
	for _, bad := range []string{"", "_INBOX.x", "$JS.ACK.a.b.c", "$JS.ACK.S.c.1.x.1.1.0"} {
		if _, ok := StreamSeq(bad); ok {
			t.Errorf("StreamSeq(%q) accepted", bad)
		}
	}
	if n := testing.AllocsPerRun(100, func() { StreamSeq("$JS.ACK.GRAD.cons.1.4711.12.1700000000000000000.0") }); n != 0 {
		t.Errorf("StreamSeq allocates %v times", n)
	}
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestParseGradHeaders(t *testing.T) {
	h := nats.Header{}
	h.Set(HdrStep, "12")
	h.Set(HdrRank, "3")
	h.Set(HdrDtype, "f32")
	h.Set(HdrWeight, "128")
	m, rej := ParseGradHeaders(h)
	if rej != nil || m.Step != 12 || m.Rank != 3 || m.Weight != 128 || m.Version != -1 {
		t.Fatalf("got %+v %v (Version -1: absent)", m, rej)
	}
	for _, w := range []string{"0x1p-126", "3.4028234663852886e38"} { // the ends of the range
		h.Set(HdrWeight, w)
		if m, rej = ParseGradHeaders(h); rej != nil {
			t.Fatalf("weight %s: %v", w, rej)
		}
	}
	h.Set(HdrVersion, "0")
	if m, rej = ParseGradHeaders(h); rej != nil || m.Version != 0 {
		t.Fatalf("%s 0: got %+v %v", HdrVersion, m, rej)
	}
	h.Set(HdrVersion, "11")
	if m, rej = ParseGradHeaders(h); rej != nil || m.Version != 11 {
		t.Fatalf("%s 11: got %+v %v", HdrVersion, m, rej)
	}
	for _, dt := range []Dtype{BF16, F16, F32} {
		h.Set(HdrDtype, dt.String())
		if m, rej = ParseGradHeaders(h); rej != nil || m.Dtype != dt {
			t.Fatalf("%s %s: got %+v %v", HdrDtype, dt, m, rej)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ParseGradHeaders(h) }); n != 0 {
		t.Errorf("ParseGradHeaders allocates %v times", n)
	}
	for _, c := range []struct {
		key, val string
		want     Reason
	}{
		{HdrStep, "", ReasonMissingHeader}, {HdrStep, "0", ReasonBadHeader}, {HdrStep, "+1", ReasonBadHeader}, {HdrStep, "01", ReasonBadHeader}, {HdrRank, "00", ReasonBadHeader},
		{HdrRank, "-1", ReasonBadHeader}, {HdrRank, "", ReasonMissingHeader}, {HdrDtype, "f64", ReasonBadDtype}, {HdrDtype, "BF16", ReasonBadDtype}, {HdrDtype, "fp16", ReasonBadDtype},
		{HdrWeight, "NaN", ReasonBadHeader}, {HdrWeight, "0", ReasonBadHeader},
		// float32 would make these Inf, 0 or subnormal: Inf or NaN parameters from finite gradients.
		{HdrWeight, "1e39", ReasonBadHeader}, {HdrWeight, "1e-320", ReasonBadHeader}, {HdrWeight, "1e-40", ReasonBadHeader},
		{HdrVersion, "-1", ReasonBadHeader}, {HdrVersion, "v3", ReasonBadHeader}, {HdrVersion, "03", ReasonBadHeader}, {HdrVersion, " 3", ReasonBadHeader},
	} {
		bad := nats.Header{}
		for k, v := range h {
			bad[k] = v
		}
		if c.val == "" {
			bad.Del(c.key)
		} else {
			bad.Set(c.key, c.val)
		}
		if _, rej := ParseGradHeaders(bad); rej == nil || rej.Reason != c.want {
			t.Errorf("%s=%q: got %v, want %s", c.key, c.val, rej, c.want)
		}
	}
	if _, rej := ParseGradHeaders(nil); rej == nil || rej.Reason != ReasonMissingHeader {
		t.Errorf("nil headers: got %v", rej)
	}
}

// A number past int64 (2^64+1) is a bad header quoted as sent, never clamped; and a rejection
// for one header still carries the rank (and step) that parsed, so the report names the sender.
func TestParseGradHeadersReportsWhatParsed(t *testing.T) {
	t.Parallel()
	h := nats.Header{}
	h.Set(HdrStep, "18446744073709551617")
	h.Set(HdrRank, "1")
	h.Set(HdrDtype, "f32")
	m, rej := ParseGradHeaders(h)
	if rej == nil || rej.Reason != ReasonBadHeader || !strings.Contains(rej.Detail, `"18446744073709551617"`) || !strings.Contains(rej.Detail, "out of range") {
		t.Fatalf("step 2^64+1: got %v, want %s quoting the value as sent and saying it is out of range", rej, ReasonBadHeader)
	}
	if m.Step != 0 || m.Rank != 1 {
		t.Fatalf("step 2^64+1 of rank 1: read step %d rank %d, want step 0 (none) and rank 1", m.Step, m.Rank)
	}
	h.Set(HdrStep, "7")
	h.Set(HdrRank, "x")
	if m, rej = ParseGradHeaders(h); rej == nil || rej.Reason != ReasonBadHeader || m.Step != 7 || m.Rank != -1 {
		t.Fatalf("rank x at step 7: got %+v %v, want a bad header with step 7 and rank -1 (none)", m, rej)
	}
	h.Set(HdrRank, "2")
	h.Set(HdrVersion, "99999999999999999999")
	if m, rej = ParseGradHeaders(h); rej == nil || rej.Reason != ReasonBadHeader || !strings.Contains(rej.Detail, `"99999999999999999999" is not a step number >= 0 (out of range`) || m.Step != 7 || m.Rank != 2 {
		t.Fatalf("version 10^20: got %+v %v", m, rej)
	}
}

func TestRejectRoundTripAndIs(t *testing.T) {
	t.Parallel()
	r := Rejectf(ReasonStaleStep, "step %d was applied", 3)
	r.Job = "j"
	back, err := UnmarshalReject(r.Marshal())
	if err != nil || *back != *r {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if !errors.Is(r, ErrReason(ReasonStaleStep)) || errors.Is(r, ErrReason(ReasonDuplicate)) {
		t.Fatal("errors.Is by reason does not work")
	}
	if len(Reasons) < DataPlaneReasons || Reasons[DataPlaneReasons-1].Code != ReasonNonFinite {
		t.Fatalf("the reasons table has %d rows; the data-plane ones (docs/PROTOCOL.md) come first", len(Reasons))
	}
}

func TestShardFromSubject(t *testing.T) {
	t.Parallel()
	if id, ok := ShardFromSubject(GradSubject("j", 17)); !ok || id != 17 {
		t.Fatalf("got %d %v", id, ok)
	}
	for _, bad := range []string{"fanin.v1.j.grad.x", "fanin.v1.j.grad.", "fanin.v1.j.grad.07", "fanin.v1.j.grad.-1"} {
		if _, ok := ShardFromSubject(bad); ok {
			t.Errorf("ShardFromSubject(%q) accepted", bad)
		}
	}
}

func TestGradAttempt(t *testing.T) {
	t.Parallel()
	id := GradMsgID("j", 3, 12, 1)
	for in, want := range map[string]int{id: 0, id + ".a1": 1, id + ".a17": 17, "": 0, "x.ab": 0} {
		if got := GradAttempt(in); got != want {
			t.Errorf("GradAttempt(%q) = %d, want %d", in, got, want)
		}
	}
}

// A gradient message GradMsg builds is what ParseGradHeaders, GradAttempt and ShardFromSubject
// read back, optional headers included or left out; a reused message set for another gradient
// carries nothing of the one before.
// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestGradMsgRoundTrip(t *testing.T) {
	cases := []Grad{
		{Job: "j", Shard: 3, Step: 1, Rank: 0},
		{Job: "j", Shard: 0, Step: 12, Rank: 7, Dtype: BF16, Weight: 128, ReplyTo: "fanin.v1.j.inbox.x", Attempt: 2},
		{Job: "j", Shard: 9, Step: 999_999_999_999_999_999, Rank: 4095, Dtype: F16, Weight: MinWeight, Versioned: true, Version: 0},
		{Job: "j", Shard: 1, Step: 5, Rank: 1, Weight: MaxWeight, Versioned: true, Version: 4, Attempt: 1},
		{Job: "j", Shard: 1, Step: 6, Rank: 1, Weight: 0.1},
	}
	reused := nats.NewMsg("")
	for _, g := range cases {
		for _, m := range []*nats.Msg{GradMsg(g, []byte{1, 2}), reused} {
			SetGradHeaders(m.Header, g)
			meta, rej := ParseGradHeaders(m.Header)
			wantWeight, wantVersion := g.Weight, g.Version
			if g.Weight == 0 {
				wantWeight = 1
			}
			if !g.Versioned {
				wantVersion = -1
			}
			if rej != nil || meta.Step != g.Step || meta.Rank != g.Rank || meta.Dtype != g.Dtype ||
				meta.Weight != wantWeight || meta.Version != wantVersion || meta.ReplyTo != g.ReplyTo {
				t.Fatalf("%+v: parsed %+v %v", g, meta, rej)
			}
			id := m.Header.Get(HdrMsgID)
			if GradAttempt(id) != g.Attempt || !strings.HasPrefix(id, GradMsgID(g.Job, g.Shard, g.Step, g.Rank)) ||
				(g.Attempt == 0 && id != GradMsgID(g.Job, g.Shard, g.Step, g.Rank)) {
				t.Fatalf("%+v: message id %q", g, id)
			}
			for k, v := range m.Header {
				if len(v) != 1 {
					t.Fatalf("%+v: header %s has %d values", g, k, len(v))
				}
			}
		}
		m := GradMsg(g, []byte{1, 2})
		if shard, ok := ShardFromSubject(m.Subject); !ok || m.Subject != GradSubject(g.Job, g.Shard) || shard != g.Shard || len(m.Data) != 2 {
			t.Fatalf("%+v: subject %q, %d bytes", g, m.Subject, len(m.Data))
		}
	}
	g := Grad{Job: "j", Shard: 2, Step: 100, Rank: 3, Weight: 0.5, ReplyTo: "fanin.v1.j.inbox.r", Versioned: true, Version: 99}
	SetGradHeaders(reused.Header, g)
	if n := testing.AllocsPerRun(100, func() { g.Step++; g.Version++; SetGradHeaders(reused.Header, g) }); n > 3 {
		t.Errorf("the next step's headers on a reused message allocate %v times (step, version, id)", n)
	}
}

func TestGradAttemptMsgID(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]string{0: "j.g.3.12.1", 1: "j.g.3.12.1.a1", 17: "j.g.3.12.1.a17", -1: "j.g.3.12.1"} {
		id := GradAttemptMsgID("j", 3, 12, 1, attempt)
		if id != want || GradAttempt(id) != max(attempt, 0) {
			t.Errorf("attempt %d: %q (GradAttempt %d), want %q", attempt, id, GradAttempt(id), want)
		}
	}
}

// The reports of a rejection: to its sender, and on its job's rejects subject with who made it
// and that origin's counts; both decode to the rejection.
func TestRejectMsgs(t *testing.T) {
	t.Parallel()
	rej := Rejectf(ReasonBadLength, "payload is %d bytes", 3)
	rej.Job, rej.Shard, rej.Step, rej.Rank, rej.MsgID = "j", 1, 4, 0, "j.g.1.4.0"
	for _, m := range []*nats.Msg{rej.ReplyMsg("fanin.v1.j.inbox.x"), rej.ReportMsg("runtime-1", "bad_length=2")} {
		back, err := UnmarshalReject(m.Data)
		if err != nil || *back != *rej || m.Header.Get(HdrReject) != string(ReasonBadLength) {
			t.Fatalf("%s: %v %+v (%v)", m.Subject, m.Header, back, err)
		}
	}
	m := rej.ReplyMsg("fanin.v1.j.inbox.x")
	if m.Subject != "fanin.v1.j.inbox.x" || len(m.Header) != 1 {
		t.Fatalf("reply: %s %v", m.Subject, m.Header)
	}
	m = rej.ReportMsg("runtime-1", "bad_length=2")
	counts, err := ParseCounts(m.Header.Get(HdrRejectCounts))
	if m.Subject != RejectsSubject("j") || m.Header.Get(HdrRejectOrigin) != "runtime-1" || err != nil || counts[ReasonBadLength] != 2 {
		t.Fatalf("report: %s %v", m.Subject, m.Header)
	}
}

func TestAckInfo(t *testing.T) {
	t.Parallel()
	seq, pending, ok := AckInfo("$JS.ACK.dom.HASH.GRAD.cons.1.42.12.1700000000000000000.9.tok")
	if !ok || seq != 42 || pending != 9 {
		t.Fatalf("got %d %d %v", seq, pending, ok)
	}
	seq, pending, ok = AckInfo("$JS.ACK.GRAD.cons.1.4711.12.1700000000000000000.3")
	if !ok || seq != 4711 || pending != 3 {
		t.Fatalf("got %d %d %v", seq, pending, ok)
	}
}

func TestRejectTally(t *testing.T) {
	t.Parallel()
	var tally RejectTally
	tally.Add("a", ReasonBadLength)
	tally.Add("b", ReasonBadLength)
	got := tally.Add("a", ReasonUnknownShard)
	if got != "bad_length=1,unknown_shard=1" {
		t.Fatalf("counts %q", got)
	}
	c, err := ParseCounts(tally.Add("a", ReasonBadLength))
	if err != nil || c[ReasonBadLength] != 2 || c[ReasonUnknownShard] != 1 || len(c) != 2 {
		t.Fatalf("ParseCounts: %v %v", c, err)
	}
	for _, bad := range []string{"x", "a=", "=1", "a=-1", "a=1,,b=2"} {
		if _, err := ParseCounts(bad); err == nil {
			t.Errorf("ParseCounts(%q) accepted", bad)
		}
	}
}

// The builders make the messages PROTOCOL.md describes, and the parsers read them back.
// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestMessageBuilders(t *testing.T) {
	created := time.Date(2026, 11, 27, 14, 0, 0, 0, time.UTC)
	inc := Incarnation(created)
	if inc == "" || inc == Incarnation(created.Add(time.Nanosecond)) || Incarnation(time.Time{}) != "" {
		t.Fatalf("incarnations %q, %q, %q", inc, Incarnation(created.Add(time.Nanosecond)), Incarnation(time.Time{}))
	}
	m := ParamsMsg("j", inc, 3, 12, 99, []byte{1, 2, 3, 4})
	if m.Subject != ParamsSubject("j", 3) || m.Header.Get(HdrMsgID) != "j.p.3.12."+inc || m.Header.Get(HdrDtype) != DtypeF32 || len(m.Data) != 4 {
		t.Fatalf("params message: %s %v", m.Subject, m.Header)
	}
	if step, err := ParseStep(m.Header); err != nil || step != 12 {
		t.Fatalf("step %d %v", step, err)
	}
	if seq, err := ParseSeq(m.Header); err != nil || seq != 99 {
		t.Fatalf("seq %d %v", seq, err)
	}
	for _, c := range []struct {
		id, inc string
		ok      bool
	}{
		{ParamsMsgID("j", inc, 3, 12), inc, true},
		{CheckpointMsgID("j", inc, 3, 12), inc, true},
		{ParamsMsgID("j", "", 3, 12), "", false},   // no incarnation named
		{ParamsMsgID("jj", inc, 3, 12), "", false}, // another job's
		{GradMsgID("j", 3, 12, 1), "", false},
	} {
		if got, ok := SnapshotIncarnation("j", c.id); got != c.inc || ok != c.ok {
			t.Errorf("SnapshotIncarnation(%q) = %q, %v; want %q, %v", c.id, got, ok, c.inc, c.ok)
		}
	}
	SetCheckpointHeaders(m.Header, "j", "", 3, 13, 100)
	if m.Header.Get(HdrMsgID) != "j.c.3.13" || m.Header.Get(HdrStep) != "13" || m.Header.Get(HdrSeq) != "100" || len(m.Header[HdrStep]) != 1 {
		t.Fatalf("checkpoint headers: %v", m.Header)
	}
	if n := testing.AllocsPerRun(100, func() { setSnapshotHeaders(m.Header, 7, 8, F32) }); n > 2 { // the two numbers' strings at most
		t.Errorf("setting the headers of a reused message allocates %v times", n)
	}
	i := InitMsg("j", 2, nil)
	if i.Subject != InitSubject("j", 2) || i.Header.Get(HdrMsgID) != InitMsgID("j", 2) || i.Header.Get(HdrStep) != "0" || i.Header.Get(HdrDtype) != DtypeF32 {
		t.Fatalf("init message: %s %v", i.Subject, i.Header)
	}
}

// A node's name is its own token when it is one already; any other name gets a token of safe
// characters that no other name shares, and the streams and subjects built from it are valid.
func TestNodeToken(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"w0", "worker-3", "ip_10_0_0_3"} {
		if got := NodeToken(n); got != n {
			t.Errorf("NodeToken(%q) = %q, want it unchanged", n, got)
		}
	}
	seen := map[string]string{}
	for _, n := range []string{"", "ip-10-0-0-3.ec2.internal", "ip-10-0-0-3_ec2_internal", "a b", "a*b", "a>b", "a.b", "a_b", "Ünïcode"} {
		tok := NodeToken(n)
		if other, ok := seen[tok]; ok {
			t.Errorf("NodeToken(%q) = NodeToken(%q) = %q", n, other, tok)
		}
		seen[tok] = n
		if strings.ContainsAny(tok, ". *>\t") || tok == "" {
			t.Errorf("NodeToken(%q) = %q: not a subject token", n, tok)
		}
		subj := NodeCkptSubject("j", tok, 3)
		if got, ok := ShardFromSubject(subj); !ok || got != 3 || strings.Count(subj, ".") != 5 {
			t.Errorf("NodeCkptSubject(j, %q, 3) = %q", tok, subj)
		}
		if !strings.HasPrefix(NodeCkptStream("j", n), NodeCkptStreamPrefix("j")) {
			t.Errorf("NodeCkptStream(j, %q) = %q", n, NodeCkptStream("j", n))
		}
	}
	if NodeTag("Worker-3") != "fanin-node:worker-3" {
		t.Errorf("NodeTag(Worker-3) = %q", NodeTag("Worker-3"))
	}
}

// A job's gradient groups split its shards by their id mod the number of streams, every shard in
// exactly one, and name their streams apart from every other job's (job ids have no '_').
func TestGradGroups(t *testing.T) {
	t.Parallel()
	if got := GradStreamOf("j", 1, 5); got != GradStream("j") {
		t.Errorf("one stream: %q, want %q", got, GradStream("j"))
	}
	seen := map[string]string{}
	for g := range 3 {
		for _, sj := range GradGroupSubjects("j", 3, g, 7) {
			shard, _ := ShardFromSubject(sj)
			if other, dup := seen[sj]; dup {
				t.Fatalf("%s in groups %s and %d", sj, other, g)
			}
			seen[sj] = strconv.Itoa(g)
			if got, want := GradStreamOf("j", 3, shard), GradGroupStream("j", g); got != want {
				t.Errorf("shard %d: stream %q, want %q", shard, got, want)
			}
		}
	}
	if len(seen) != 7 {
		t.Errorf("%d shards in the groups, want 7", len(seen))
	}
	if got := GradGroupStream("j", 2); got != "FANIN_GRAD_j_2" {
		t.Errorf("GradGroupStream = %q", got)
	}
}
