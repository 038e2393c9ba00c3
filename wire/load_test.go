package wire

import (
	"encoding/json"
	"testing"
	"time"
)

// A report from a runtime that knows nothing of nodes and bytes still decodes, with them zero.
func TestLoadReportWithoutNodeDecodes(t *testing.T) {
	t.Parallel()
	old := `{"runtime":"rt-a","cores":4,"at":"2026-11-26T10:00:00Z","nanos_per_byte":0.5,` +
		`"shards":[{"key":"j.0","job":"j","step":3,"bytes":4096,"work":0.01,"period":1000000000,` +
		`"phase":0,"burst":100000000,"queue_wait":0,"pending":0}]}`
	var rep LoadReport
	if err := json.Unmarshal([]byte(old), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Runtime != "rt-a" || rep.Cores != 4 || len(rep.Shards) != 1 || rep.Shards[0].Bytes != 4096 {
		t.Fatalf("old fields: %+v", rep)
	}
	if rep.Node != "" || rep.Server != "" || rep.NICBytesPerSec != 0 {
		t.Fatalf("node fields of an old report: %q %q %v", rep.Node, rep.Server, rep.NICBytesPerSec)
	}
	if s := rep.Shards[0]; s.BytesInPerSec != 0 || s.BytesOutPerSec != 0 {
		t.Fatalf("byte rates of an old report: %v %v", s.BytesInPerSec, s.BytesOutPerSec)
	}
}

// The new fields survive a round trip under their documented names.
func TestLoadReportNodeRoundTrip(t *testing.T) {
	t.Parallel()
	rep := LoadReport{Runtime: "rt-b", Cores: 2, At: time.Unix(5, 0).UTC(), Node: "host-1", Server: "n1",
		NICBytesPerSec: 12.5e6, Shards: []ShardLoad{{Key: "j.1", Job: "j", BytesInPerSec: 1000, BytesOutPerSec: 250}}}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"node", "server", "nic_bytes_per_sec"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("field %q missing from %s", k, data)
		}
	}
	var back LoadReport
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Node != rep.Node || back.Server != rep.Server || back.NICBytesPerSec != rep.NICBytesPerSec ||
		back.Shards[0].BytesInPerSec != 1000 || back.Shards[0].BytesOutPerSec != 250 {
		t.Fatalf("round trip: got %+v, want %+v", back, rep)
	}
}
