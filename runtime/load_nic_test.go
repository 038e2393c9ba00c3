package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/wire"
)

func TestParseBandwidth(t *testing.T) {
	t.Parallel()
	good := map[string]float64{
		"100Mbit": 12.5e6, "10Gbit": 1.25e9, "2.5gbit": 312.5e6, "1kbit": 125, "8bit/s": 1,
		"125MB": 125e6, "1GB/s": 1e9, "3B": 3, "0": 0, " 1Tbit ": 125e9,
	}
	for in, want := range good {
		got, err := runtime.ParseBandwidth(in)
		if err != nil || math.Abs(got-want) > 1e-9*want {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "100", "Mbit", "100Mbps", "-1Gbit", "1..2Gbit", "5b", "1e3Mbit"} {
		if got, err := runtime.ParseBandwidth(in); !errors.Is(err, runtime.ErrBandwidth) {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want an ErrBandwidth", in, got, err)
		}
	}
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		if err := runtime.WithNICBandwidth(v)(nil); err == nil { // refused before it touches the runtime
			t.Errorf("WithNICBandwidth(%v) accepted", v)
		}
	}
}

func TestLinkBandwidth(t *testing.T) {
	t.Parallel()
	route := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
		"wlan0\t00000000\t010200C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
		"eth1\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" +
		"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	noDefault := "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
		"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	cases := []struct {
		name    string
		fs      fstest.MapFS
		dev     string
		bytesPS float64
	}{
		{"the default route's lowest metric", fstest.MapFS{
			"proc/net/route": {Data: []byte(route)}, "sys/class/net/eth1/speed": {Data: []byte("25000\n")},
			"sys/class/net/wlan0/speed": {Data: []byte("100\n")}}, "eth1", 25e9 / 8},
		{"speed -1 (a virtual interface)", fstest.MapFS{
			"proc/net/route": {Data: []byte(route)}, "sys/class/net/eth1/speed": {Data: []byte("-1\n")}}, "eth1", 0},
		{"no speed file", fstest.MapFS{"proc/net/route": {Data: []byte(route)}}, "eth1", 0},
		{"no default route", fstest.MapFS{"proc/net/route": {Data: []byte(noDefault)}}, "", 0},
		{"no route table", fstest.MapFS{}, "", 0},
	}
	for _, c := range cases {
		dev, bps := runtime.LinkBandwidth(c.fs)
		if dev != c.dev || bps != c.bytesPS {
			t.Errorf("%s: LinkBandwidth = %q, %v; want %q, %v", c.name, dev, bps, c.dev, c.bytesPS)
		}
	}
}

// A runtime's load reports name its node, its NATS server and its NIC, and each shard's bytes in
// and out per second: what a step brings in (every rank's f32 gradient) and takes out (one bf16
// parameters message) over the step period, and the part of its work in its update; with
// gradients stored in a stream and sent directly.
func TestLoadReportCountsShardBytes(t *testing.T) {
	t.Parallel()
	for _, g := range []string{job.GradientsStored, job.GradientsDirect} {
		t.Run(g, func(t *testing.T) { t.Parallel(); testLoadReportBytes(t, g) })
	}
}

func testLoadReportBytes(t *testing.T, gradients string) {
	st := testutil.Stack(t, 1)
	ctx := context.Background()
	spec := job.Spec{
		ID: "bytes-" + gradients, Ranks: 3, ParamDtype: wire.DtypeBF16, Gradients: gradients,
		Tensors:  []job.Tensor{{Name: "w", Shape: []int{30, 100}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		Init:     job.Init{Kind: "normal", Seed: 3, Scale: 0.1}, ShardSize: 4 << 10,
	}
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Train(t, st.URL, rec, 12)

	reports := loadReports(t, st.URL, wire.LoadWildcard, 64)
	sizes := map[string]job.Shard{}
	for _, s := range rec.Layout.Shards {
		sizes[wire.PlacementKey(rec.Spec.ID, s.ID)] = s
	}
	var rep wire.LoadReport
	deadline := time.After(20 * time.Second)
	for len(rep.Shards) < len(sizes) {
		select {
		case rep = <-reports:
		case <-deadline:
			t.Fatalf("no load report with the job's %d shards", len(sizes))
		}
	}
	if want := st.NATS.Name(); rep.Server != want || rep.Node != want {
		t.Errorf("report's server %q and node %q, want both the server's name %q", rep.Server, rep.Node, want)
	}
	if rep.NICBytesPerSec != 0 {
		t.Errorf("NIC %v bytes/s reported by a runtime given none", rep.NICBytesPerSec)
	}
	for _, s := range rep.Shards {
		sh, ok := sizes[s.Key]
		if !ok {
			continue
		}
		if s.Period <= 0 {
			t.Fatalf("%s: no period after 12 steps", s.Key)
		}
		p := s.Period.Seconds()
		in, out := float64(spec.Ranks*sh.Bytes()), float64(sh.Len*2)
		if err := near(s.BytesInPerSec*p, in, p); err != nil {
			t.Errorf("%s: bytes in per step: %v", s.Key, err)
		}
		if err := near(s.BytesOutPerSec*p, out, p); err != nil {
			t.Errorf("%s: bytes out per step: %v", s.Key, err)
		}
		// The update (sgd's, once a step) is part of the step's work, not all of it (3 sums).
		if !(s.Apply > 0 && s.Apply < s.Work) {
			t.Errorf("%s: update %v s of a step's work %v s, want within it", s.Key, s.Apply, s.Work)
		}
	}
}

// near says how a measured figure, a rate times the period p (in seconds), misses the one expected,
// beyond the rounding of the period to nanoseconds: relatively 1 ns in p, twice (the rate is
// derived from a period too), and at least a millionth. A direct shard's period is under a
// millisecond here.
func near(got, want, p float64) error {
	if math.Abs(got-want) > max(1e-6, 2e-9/p)*want {
		return fmt.Errorf("%.3f, want %.0f", got, want)
	}
	return nil
}

// A runtime reports its node, server and NIC as soon as it starts, not a reporting period later:
// until then the autoscaler gives it no new shards (with the periodic reports an hour apart here,
// only the first one can arrive). Not parallel: it sets the interval of every runtime it starts.
func TestFirstLoadReportAtStart(t *testing.T) {
	defer runtime.SetLoadInterval(time.Hour)()
	st := testutil.Stack(t, 1)
	reports := loadReports(t, st.URL, wire.LoadSubject("rt-first"), 4)
	runRuntime(t, st.URL, runtime.WithID("rt-first"), runtime.WithNICBandwidth(12.5e6))
	select {
	case rep := <-reports:
		if rep.Runtime != "rt-first" || rep.NICBytesPerSec != 12.5e6 || rep.Server != st.NATS.Name() {
			t.Errorf("first report: runtime %q, NIC %v, server %q; want rt-first, 12.5e6, %q", rep.Runtime, rep.NICBytesPerSec, rep.Server, st.NATS.Name())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no load report from a runtime that started (the next periodic one is an hour away)")
	}
}

// A runtime given its process's CPU reports the CPU per unit of its shards' work, which the
// autoscaler plans. The "process" here spends three times the work. Not parallel: it sets the
// interval and the least work of the overhead of every runtime it starts.
func TestLoadReportsTheProcessOverhead(t *testing.T) {
	defer runtime.SetLoadInterval(50 * time.Millisecond)()
	defer runtime.SetMinOverheadWork(time.Nanosecond)()
	st := testutil.Stack(t, 0)
	reports := loadReports(t, st.URL, wire.LoadSubject("rt-over"), 256)
	var r atomic.Pointer[runtime.Runtime]
	cpu := func() time.Duration {
		if rt := r.Load(); rt != nil {
			return 3 * rt.Stats().WorkTime
		}
		return 0
	}
	r.Store(runRuntime(t, st.URL, runtime.WithID("rt-over"), runtime.WithProcessCPU(cpu)))
	rec, err := st.Gateway.CreateJob(context.Background(), testSpec("over", "sgd", map[string]float64{"lr": 0.1}))
	if err != nil {
		t.Fatal(err)
	}
	stop := testutil.TrainUntilStopped(t, st.URL, rec, 0)
	defer stop()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case rep := <-reports:
			if rep.Overhead == 0 {
				continue // no work measured yet
			}
			// The work read for the report and the CPU read after it may be a fold apart.
			if rep.Overhead < 3 || rep.Overhead > 3.3 {
				t.Fatalf("overhead %v, want 3 (the process's CPU is three times the work)", rep.Overhead)
			}
			return
		case <-deadline:
			t.Fatal("no load report with an overhead from a runtime that worked")
		}
	}
}

// runRuntime starts a runtime with opts on its own connection to url, running until the test ends.
func runRuntime(t *testing.T, url string, opts ...runtime.Option) *runtime.Runtime {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.New(nc, opts...)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
	return r
}

// loadReports subscribes to the load reports on subject, up to buffer of them waiting (the rest are
// dropped), until the test ends; the subscription is in place when it returns.
func loadReports(t *testing.T, url, subject string, buffer int) <-chan wire.LoadReport {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	reports := make(chan wire.LoadReport, buffer)
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var rep wire.LoadReport
		if json.Unmarshal(m.Data, &rep) == nil {
			select {
			case reports <- rep:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return reports
}
