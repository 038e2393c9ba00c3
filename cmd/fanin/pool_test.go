package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/wire"
)

// A NIC is shown as its link speed, which --nic-bandwidth reads back to the same bytes per second.
func TestBandwidthShownAsLinkSpeed(t *testing.T) {
	t.Parallel()
	for bps, want := range map[float64]string{12.5e6: "100Mbit", 62500: "0.5Mbit", 1.25e9: "10Gbit", 3.125e9: "25Gbit", 0: "-"} {
		got := bandwidth(bps)
		if got != want {
			t.Errorf("bandwidth(%v) = %q, want %q", bps, got, want)
			continue
		}
		if bps == 0 {
			continue
		}
		if back, err := runtime.ParseBandwidth(got); err != nil || back != bps {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want %v", got, back, err, bps)
		}
	}
}

// fanin pool shows each runtime's node, NIC and bytes in and out.
func TestPoolShowsNodesAndNICs(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	p := &api.Pool{Runtimes: []api.RuntimeStatus{
		{RuntimeInfo: wire.RuntimeInfo{ID: "rt-a", Cores: 2, Started: now}, Node: "host-1", NICBytesPerSec: 12.5e6,
			BytesInPerSec: 4.2e6, BytesOutPerSec: 1.05e6},
		{RuntimeInfo: wire.RuntimeInfo{ID: "rt-b", Cores: 2, Started: now}},
	}}
	var b strings.Builder
	if err := printPool(&b, p, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if len(lines) < 4 || !strings.Contains(lines[1], "NODE") || !strings.Contains(lines[1], "NIC") {
		t.Fatalf("no NODE and NIC columns:\n%s", b.String())
	}
	if f := strings.Fields(lines[2]); !contains(f, "host-1") || !contains(f, "100Mbit") || !contains(f, "4.2/1.1") {
		t.Errorf("rt-a's row %q, want host-1, 100Mbit and 4.2/1.1 MB/s", lines[2])
	}
	if f := strings.Fields(lines[3]); !contains(f, "-") || !contains(f, "0.0/0.0") {
		t.Errorf("rt-b's row %q, want - for its node and NIC", lines[3])
	}
}

func contains(fields []string, s string) bool {
	for _, f := range fields {
		if f == s {
			return true
		}
	}
	return false
}
