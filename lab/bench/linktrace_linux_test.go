package bench

import (
	"math"
	"testing"
	"time"
)

func TestParseNetDev(t *testing.T) {
	text := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     140       2    0    0    0     0          0         0      140       2    0    0    0     0       0          0
  eth0: 16213411   11034    0    0    0     0          0         0 15933122   10901    0    0    0     0       0          0
`
	b, err := parseNetDev([]byte(text), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if b != (linkBytes{16213411, 15933122}) {
		t.Errorf("eth0: %+v", b)
	}
	if _, err := parseNetDev([]byte(text), "eth1"); err == nil {
		t.Error("no eth1: no error")
	}
	if _, err := parseNetDev([]byte("  eth0: 1 2 3\n"), "eth0"); err == nil {
		t.Error("a short line: no error")
	}
}

// Two nodes idle for 0.1 s, then full both ways for 0.5 s, then at a quarter for 0.3 s, then idle:
// the idle ends are left out, the rest is 72% used and below half 3/8 of the time. A node of
// another prefix does not count.
func TestLinkTraceUse(t *testing.T) {
	const mbit = 100
	full := float64(mbit) * 1e6 / 8 // bytes per second each way
	rate := func(s float64) float64 {
		switch {
		case s < 0.1 || s >= 0.9:
			return 0
		case s < 0.6:
			return full
		default:
			return full / 4
		}
	}
	tr := linkTrace{every: 10 * time.Millisecond, nodes: []string{"w0", "w1", "svc"}, mbit: []int{mbit, mbit, mbit}}
	for range tr.nodes {
		var ss []linkSample
		var bytes float64
		for k := range 101 {
			s := float64(k) / 100
			ss = append(ss, linkSample{at: time.Duration(k) * 10 * time.Millisecond, rx: uint64(bytes), tx: uint64(bytes)})
			bytes += rate(s) * 0.01
		}
		tr.samples = append(tr.samples, ss)
	}
	tr.samples[2] = tr.samples[2][:1] // svc: nothing traced, and not asked for
	u, ok := tr.use("w", 50*time.Millisecond)
	if !ok {
		t.Fatal("no use")
	}
	if want := (0.5 + 0.3/4) / 0.8; math.Abs(u.mean-want) > 1e-3 {
		t.Errorf("mean use %.4f, want %.4f", u.mean, want)
	}
	if want := 0.3 / 0.8; math.Abs(u.belowHalf-want) > 1e-9 {
		t.Errorf("below half %.4f, want %.4f", u.belowHalf, want)
	}
	if _, ok := tr.use("svc", 50*time.Millisecond); ok {
		t.Error("a node with one sample: traced")
	}
	// A sampler that fell 120 ms behind (no sample from 0.30 to 0.42 s, while the links were
	// full): the bins in between are interpolated, not taken as idle.
	for i := range 2 {
		var kept []linkSample
		for _, x := range tr.samples[i] {
			if x.at <= 300*time.Millisecond || x.at >= 420*time.Millisecond {
				kept = append(kept, x)
			}
		}
		tr.samples[i] = kept
	}
	g, ok := tr.use("w", 50*time.Millisecond)
	if !ok || math.Abs(g.mean-u.mean) > 1e-3 || g.belowHalf != u.belowHalf {
		t.Errorf("with a gap in the samples: %+v, want %+v", g, u)
	}
}
