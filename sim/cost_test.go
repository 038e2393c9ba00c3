package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A service cost reads back as written; bad figures and unknown fields are refused, naming the
// field.
func TestServiceCostFile(t *testing.T) {
	c := ServiceCost{Date: "2026-11-26 18:00 UTC", Machine: "test", BrokerCPUPerByteIn: 1e-9, BrokerCPUPerByteOut: 0.5e-9,
		RuntimeCPUPerByte: 2e-9, KernelCPUPerByte: 0.5e-9, Measured: &CostMeasurement{GradientBytes: 1e9}}
	path := filepath.Join(t.TempDir(), "cost.json")
	if err := os.WriteFile(path, c.MarshalIndent(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadServiceCost(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.BrokerCPUPerByteOut != c.BrokerCPUPerByteOut || got.RuntimeCPUPerByte != c.RuntimeCPUPerByte || got.Measured.GradientBytes != 1e9 {
		t.Errorf("read %+v, wrote %+v", got, c)
	}
	for bad, want := range map[string]string{
		`{"broker_cpu_s_per_byte_in": -1}`:                                "broker_cpu_s_per_byte_in",
		`{"runtime_cpu_s_per_byte": 1e-9, "kernel_cpu_s_per_byte": 2e-9}`: "exceeds",
		`{"broker_cpu_s_per_byte": 1e-9}`:                                 "unknown field",
	} {
		if _, err := ParseServiceCost([]byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseServiceCost(%s) = %v, want an error with %q", bad, err, want)
		}
	}
}

// The whole service's GB per core-second, as the bench reports it: a job of 4 ranks moves each
// gradient byte in and out of the broker once, and the parameters (a quarter of those bytes) in
// once and out four times.
func TestServiceCostGBPerCoreSecond(t *testing.T) {
	c := ServiceCost{BrokerCPUPerByteIn: 1e-9, BrokerCPUPerByteOut: 0.5e-9, RuntimeCPUPerByte: 2e-9}
	// Per gradient byte: in 1.25 ns, out 2 x 0.5 ns, runtime 2 ns: 4.25 ns.
	if got, want := c.GBPerCoreSecond(4), 1/4.25; !near(got, want, 1e-12) {
		t.Errorf("GB per core-second %v, want %v", got, want)
	}
	if got := (ServiceCost{}).GBPerCoreSecond(4); got != 0 {
		t.Errorf("no cost: %v, want 0 (unknown)", got)
	}
}

// The measured file a simulation reads for jobs with direct gradients (--cost) is valid, and
// says so: a direct measurement costs the broker less per byte than the stored default.
func TestDirectServiceCostFile(t *testing.T) {
	c, err := ReadServiceCost("service-cost-direct.json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.Source, "gradients direct") {
		t.Errorf("source %q does not say the gradients were direct", c.Source)
	}
	if def := DefaultServiceCost(); c.BrokerCPUPerByteIn >= def.BrokerCPUPerByteIn {
		t.Errorf("direct broker %.3g s per byte, stored default %.3g: want less", c.BrokerCPUPerByteIn, def.BrokerCPUPerByteIn)
	}
}

// The measured file for runtimes that run the NATS servers (--broker in-runtimes) is valid and
// says so: the runtime's rate holds the server's CPU, so it is dearer per byte than a runtime's
// alone, and what is left to the broker (the idle control plane) is small beside it.
func TestEmbeddedServiceCostFile(t *testing.T) {
	c, err := ReadServiceCost("service-cost-embedded.json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.Source, "--nats-config") || !strings.Contains(c.Notes, "--broker in-runtimes") {
		t.Errorf("source %q, notes %q: want the layout and how to simulate it named", c.Source, c.Notes)
	}
	direct, err := ReadServiceCost("service-cost-direct.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.RuntimeCPUPerByte <= direct.RuntimeCPUPerByte || c.BrokerCPUPerByteIn > c.RuntimeCPUPerByte/10 {
		t.Errorf("runtime %.3g s per byte (a runtime alone: %.3g), broker %.3g: want the server's CPU in the runtime's",
			c.RuntimeCPUPerByte, direct.RuntimeCPUPerByte, c.BrokerCPUPerByteIn)
	}
}
