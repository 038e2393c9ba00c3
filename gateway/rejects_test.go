package gateway_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/wire"
)

// Rejection counts are exact for a job's whole life, even when a burst of rejections is larger than
// what the rejects stream keeps per job (gateway.RejectsPerJob) and the counter reads them late:
// every rejection announces its origin's cumulative counts.
func TestRejectCountsExactUnderBursts(t *testing.T) {
	t.Parallel()
	st := authStack(t, 1)
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	spec := smallSpec("burst")
	spec.Ranks = 100 // room in the gradient stream for the bad messages below (8 steps' worth)
	var created api.JobCreated
	c.call("POST", "/v1/jobs", "application/json", specJSON(spec), 201, &created)

	// A runtime's rejections: bad lengths from the job's own workers.
	nc := natsAs(t, st.URL, created.Credentials, nil)
	js, _ := jetstream.New(nc)
	const bad = 1200
	futs := make([]jetstream.PubAckFuture, 0, bad)
	for i := range bad {
		m := gradMsg("burst", 0, 1, i%100, make([]byte, 8))
		m.Header.Set(wire.HdrMsgID, fmt.Sprintf("bad-%d", i))
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("a bad gradient was not stored: %v", err)
		}
	}

	// Another origin's burst, published in one go far beyond what the stream keeps for the job.
	comp, err := st.Connect("test-origin")
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	var tally wire.RejectTally
	const burst = 3 * gateway.RejectsPerJob
	for range burst {
		m := nats.NewMsg(wire.RejectsSubject("burst"))
		m.Header.Set(wire.HdrReject, string(wire.ReasonDuplicate))
		m.Header.Set(wire.HdrRejectOrigin, "test-origin")
		m.Header.Set(wire.HdrRejectCounts, tally.Add("burst", wire.ReasonDuplicate))
		m.Data = []byte(`{"reason":"duplicate","detail":"test"}`)
		if err := comp.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	_ = comp.Flush()

	c.awaitCount("burst", wire.ReasonBadLength, bad)
	c.awaitCount("burst", wire.ReasonDuplicate, burst)
	var rj api.Rejects
	c.call("GET", "/v1/jobs/burst/rejects?limit=1000", "", "", 200, &rj)
	if len(rj.Recent) != gateway.RejectsPerJob || rj.Counts[wire.ReasonDuplicate] != burst || rj.Counts[wire.ReasonBadLength] != bad {
		t.Fatalf("%d recent rejections kept (want the latest %d), counts %v", len(rj.Recent), gateway.RejectsPerJob, rj.Counts)
	}
}
