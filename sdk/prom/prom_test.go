package prom_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/sdk/prom"
)

// Clients may share a registry: the second finds the first's collectors. A name another kind of
// metric already holds is an error, and so is no registry.
func TestWithMetricsSharedRegistry(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(testutil.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reg := prometheus.NewRegistry()
	for i := range 2 {
		if _, err := sdk.New(nc, prom.WithMetrics(reg)); err != nil {
			t.Fatalf("client %d with a shared registry: %v", i, err)
		}
	}
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: prom.WorkerSteps, Help: "not the SDK's"}))
	if _, err := sdk.New(nc, prom.WithMetrics(clash)); err == nil {
		t.Fatal("WithMetrics over a clashing metric succeeded, want an error")
	}
	if _, err := sdk.New(nc, prom.WithMetrics(nil)); err == nil {
		t.Fatal("WithMetrics(nil) succeeded, want an error")
	}
}
