package wire

import (
	"encoding/binary"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzGradMessage feeds the gradient decoder arbitrary headers and payloads: ParseGradHeaders and
// the payload checks a runtime applies (length against the shard, NaN/Inf). Nothing panics; what
// is accepted is well formed (a step >= 1 and a rank >= 0 written in plain decimal digits, leading
// zeros allowed, a finite weight > 0, f32, bf16 or f16); what is refused carries a reason from the
// table and a detail; and a payload that passes CheckPayload holds exactly the shard's finite
// elements of its dtype.
//
//	go test -run '^$' -fuzz FuzzGradMessage -fuzztime 30s ./wire
func FuzzGradMessage(f *testing.F) {
	f.Add("1", "0", "f32", "", "", true, true, true, []byte{0, 0, 128, 63}, 1)
	f.Add("12", "3", "f32", "128", "_INBOX.x", true, true, true, make([]byte, 4096), 1024)
	f.Add("0", "0", "f32", "", "", true, true, true, []byte{}, 0)
	f.Add("+1", "-1", "bf16", "NaN", "", true, true, true, []byte{1, 2, 3}, 1)
	f.Add("2", "1", "bf16", "", "", true, true, true, []byte{0x80, 0x3f, 0xc0, 0x7f}, 2)
	f.Add("2", "1", "f16", "", "", true, true, true, []byte{0x00, 0x3c, 0x00, 0x7c}, 2)
	f.Add("2", "1", "f16", "", "", true, true, true, []byte{0x00, 0x3c, 0x00, 0x7c}, 1)
	f.Add("999999999999999999", "2147483648", "f32", "1e309", "", true, true, true, []byte{0, 0, 192, 127}, 1)
	f.Add("", "", "", "", "", false, false, false, []byte(nil), 4)
	f.Add("1", "0", "f32", "0", "", true, true, false, []byte{0, 0, 128, 255}, 1)
	f.Add("01", "00", "f32", "", "", true, true, true, []byte{0, 0, 128, 63}, 1)
	f.Add("٣", "0x1", "F32", " 1", "", true, true, true, []byte{0, 0, 128, 127, 0}, 1)
	f.Fuzz(func(t *testing.T, step, rank, dtype, weight, replyTo string, hasStep, hasRank, hasDtype bool, payload []byte, shardLen int) {
		var h nats.Header
		if hasStep || hasRank || hasDtype || weight != "" {
			h = nats.Header{}
		}
		set := func(ok bool, k, v string) {
			if ok {
				h[k] = []string{v}
			}
		}
		set(hasStep, HdrStep, step)
		set(hasRank, HdrRank, rank)
		set(hasDtype, HdrDtype, dtype)
		set(weight != "", HdrWeight, weight)
		set(replyTo != "" && h != nil, HdrReplyTo, replyTo)

		meta, rej := ParseGradHeaders(h)
		if rej != nil {
			if !KnownReason(rej.Reason) || rej.Detail == "" {
				t.Fatalf("rejection %+v: unknown reason or no detail", rej)
			}
			return
		}
		if !hasStep || !hasRank || !hasDtype || dtype != DtypeF32 && dtype != DtypeBF16 && dtype != DtypeF16 || meta.Dtype.String() != dtype {
			t.Fatalf("accepted without a required header or with dtype %q as %v: %v", dtype, meta.Dtype, h)
		}
		if n, err := strconv.ParseInt(step, 10, 64); meta.Step < 1 || err != nil || n != meta.Step || !digits(step) {
			t.Fatalf("step %q accepted as %d", step, meta.Step)
		}
		if n, err := strconv.ParseInt(rank, 10, 64); meta.Rank < 0 || err != nil || n != int64(meta.Rank) || !digits(rank) {
			t.Fatalf("rank %q accepted as %d", rank, meta.Rank)
		}
		if !(meta.Weight >= MinWeight && meta.Weight <= MaxWeight) || (weight == "" && meta.Weight != 1) {
			t.Fatalf("weight %q accepted as %v", weight, meta.Weight)
		}
		if meta.ReplyTo != replyTo {
			t.Fatalf("reply-to %q read as %q", replyTo, meta.ReplyTo)
		}

		// The payload checks of a shard of shardLen elements, finite required, against a decoding
		// of each element by its fields.
		shardLen = int(uint(shardLen) % (1 << 16))
		es := map[string]int{DtypeF32: 4, DtypeBF16: 2, DtypeF16: 2}[dtype]
		rej = CheckPayload(payload, meta.Dtype, shardLen, 3, true)
		if len(payload) != es*shardLen {
			if rej == nil || rej.Reason != ReasonBadLength && rej.Reason != ReasonOversized || !strings.Contains(rej.Detail, dtype) || !strings.Contains(rej.Detail, strconv.Itoa(es*shardLen)+" bytes") {
				t.Fatalf("%d bytes for %d %s elements: %v", len(payload), shardLen, dtype, rej)
			}
			return
		}
		bad := -1
		for i := shardLen - 1; i >= 0; i-- {
			var special bool
			switch dtype {
			case DtypeF32:
				special = binary.LittleEndian.Uint32(payload[4*i:])>>23&0xff == 0xff
			case DtypeBF16:
				special = binary.LittleEndian.Uint16(payload[2*i:])>>7&0xff == 0xff
			case DtypeF16:
				special = binary.LittleEndian.Uint16(payload[2*i:])>>10&0x1f == 0x1f
			}
			if special {
				bad = i
			}
		}
		switch {
		case bad < 0 && rej != nil:
			t.Fatalf("a finite %s payload refused: %v", dtype, rej)
		case bad >= 0 && (rej == nil || rej.Reason != ReasonNonFinite || !strings.Contains(rej.Detail, "element "+strconv.Itoa(bad)+" ")):
			t.Fatalf("element %d is NaN or Inf, CheckPayload said %v", bad, rej)
		}
		if rej := CheckPayload(payload, meta.Dtype, shardLen, 3, false); rej != nil {
			t.Fatalf("allow_nonfinite: %v", rej)
		}
	})
}

// FuzzControlStrings feeds the other decoders of the wire protocol: rejection reports, ack reply
// subjects, shard subjects, message ids. Nothing panics, and what decodes round-trips.
//
//	go test -run '^$' -fuzz FuzzControlStrings -fuzztime 30s ./wire
func FuzzControlStrings(f *testing.F) {
	f.Add([]byte(`{"reason":"stale_step","detail":"d","job":"j","shard":1,"step":3,"rank":0}`), "$JS.ACK.GRAD.cons.1.4711.12.1700000000000000000.0", "fanin.v1.j.grad.17", "j.g.3.12.1.a2")
	f.Add([]byte(`{"reason":""}`), "$JS.ACK.dom.HASH.GRAD.cons.1.42.12.1700000000000000000.9.tok", "fanin.v1.j.grad.07", "x.ab")
	f.Add([]byte(`null`), "$JS.ACK.a.b.c", "fanin.v1.j.grad.", "")
	f.Fuzz(func(t *testing.T, report []byte, reply, subject, msgID string) {
		if r, err := UnmarshalReject(report); err == nil {
			if r.Reason == "" {
				t.Fatal("a report without a reason decoded")
			}
			back, err := UnmarshalReject(r.Marshal())
			if err != nil || *back != *r {
				t.Fatalf("round trip: %+v -> %+v (%v)", r, back, err)
			}
		}
		if seq, pending, ok := AckInfo(reply); ok {
			if s2, ok2 := StreamSeq(reply); !ok2 || s2 != seq {
				t.Fatalf("AckInfo and StreamSeq disagree on %q", reply)
			}
			_ = pending
		}
		if id, ok := ShardFromSubject(subject); ok {
			if id < 0 || GradSubject("j", id)[len("fanin.v1.j.grad."):] != subject[len(subject)-len(strconv.Itoa(id)):] {
				t.Fatalf("shard %d from %q", id, subject)
			}
		}
		if GradAttempt(msgID) < 0 {
			t.Fatalf("negative attempt from %q", msgID)
		}
	})
}

// digits reports whether s is a number in canonical decimal.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != "" && (s[0] != '0' || len(s) == 1)
}
