package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
)

// ServiceCost is what the whole service spends per byte, as `fanin bench --only service-cost`
// measures it and writes it (service-cost.json): the NATS server's CPU per byte it takes in and
// per byte it sends out, and a runtime process's CPU per byte of gradient it sums (its kernels
// and everything else it does: decoding, its NATS client, acknowledgements, publishing the
// parameters). The simulator charges the broker and sizes the runtimes' cores from it (fanin sim
// --cost).
type ServiceCost struct {
	Date    string `json:"date"`    // of the measurement, UTC
	Commit  string `json:"commit"`  // of the code measured
	Machine string `json:"machine"` // CPU model, cores, OS
	Source  string `json:"source"`  // the command and scenario that measured it
	// BrokerCPUPerByteIn and BrokerCPUPerByteOut are seconds of NATS server CPU per byte a client
	// publishes into it (gradients, parameters) and per byte it delivers to a client (gradients to
	// the runtimes, parameters to the workers).
	BrokerCPUPerByteIn  float64 `json:"broker_cpu_s_per_byte_in"`
	BrokerCPUPerByteOut float64 `json:"broker_cpu_s_per_byte_out"`
	// RuntimeCPUPerByte is seconds of a runtime process's CPU per gradient byte it receives and
	// sums, everything the process does included; KernelCPUPerByte is the part of it spent in the
	// aggregation function (what the runtime reports as a shard's Work).
	RuntimeCPUPerByte float64 `json:"runtime_cpu_s_per_byte"`
	KernelCPUPerByte  float64 `json:"kernel_cpu_s_per_byte"`
	// Measured holds the totals the figures were computed from; the simulator does not read it.
	Measured *CostMeasurement `json:"measured,omitempty"`
	Notes    string           `json:"notes,omitempty"`
}

// CostMeasurement is one loopback run of the bench: the bytes the service moved and the CPU its
// processes used while the workers stepped.
type CostMeasurement struct {
	Scenario      string  `json:"scenario"`       // e.g. "N=8,Shard=4MiB, 3 runtimes, 20 steps"
	GradientBytes float64 `json:"gradient_bytes"` // summed in the steps: steps x ranks x model bytes
	// RuntimeBytesIn is the gradient bytes the runtimes accepted: more than GradientBytes when
	// some were delivered again (a shard moved, an acknowledgement was late); their CPU is in the
	// figures, which are per byte summed.
	RuntimeBytesIn float64 `json:"runtime_bytes_in"`
	BrokerBytesIn  float64 `json:"broker_bytes_in"`
	BrokerOut      float64 `json:"broker_bytes_out"`
	BrokerCPU      float64 `json:"broker_cpu_s"`  // the NATS server's process (gateway and autoscaler included)
	RuntimeCPU     float64 `json:"runtime_cpu_s"` // the runtime processes, summed
	KernelTime     float64 `json:"kernel_s"`      // of which in the aggregation function
	// LoadAverage is the machine's 1-minute load average before and after the run: CPU per byte
	// grows when other processes share the cores.
	LoadAverage string `json:"load_average,omitempty"`
}

// GBPerCoreSecond is the whole service's figure, as the bench reports it: GB of gradient summed
// per core-second of the broker and the runtimes, for a job of ranks ranks (each gradient byte
// goes in and out of the broker once, and the parameters, 1/ranks of the gradient bytes, go in
// once and out to every rank).
func (c ServiceCost) GBPerCoreSecond(ranks int) float64 {
	n := float64(ranks)
	perByte := c.BrokerCPUPerByteIn*(1+1/n) + c.BrokerCPUPerByteOut*2 + c.RuntimeCPUPerByte
	if perByte <= 0 {
		return 0
	}
	return 1e-9 / perByte
}

// Validate checks the figures.
func (c ServiceCost) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"broker_cpu_s_per_byte_in", c.BrokerCPUPerByteIn}, {"broker_cpu_s_per_byte_out", c.BrokerCPUPerByteOut},
		{"runtime_cpu_s_per_byte", c.RuntimeCPUPerByte}, {"kernel_cpu_s_per_byte", c.KernelCPUPerByte}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("service cost: %s must be >= 0 seconds per byte, got %v", f.name, f.v))
		}
	}
	if c.RuntimeCPUPerByte > 0 && c.KernelCPUPerByte > c.RuntimeCPUPerByte {
		errs = append(errs, fmt.Errorf("service cost: kernel_cpu_s_per_byte %v exceeds runtime_cpu_s_per_byte %v, which includes it", c.KernelCPUPerByte, c.RuntimeCPUPerByte))
	}
	return errors.Join(errs...)
}

// ParseServiceCost reads a service cost (JSON, as the bench writes it), rejecting unknown fields
// and figures that are not costs.
func ParseServiceCost(data []byte) (ServiceCost, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c ServiceCost
	if err := dec.Decode(&c); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// ReadServiceCost reads a service cost file.
func ReadServiceCost(path string) (ServiceCost, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ServiceCost{}, err
	}
	c, err := ParseServiceCost(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// MarshalIndent renders the cost as the JSON ParseServiceCost reads.
func (c ServiceCost) MarshalIndent() []byte {
	b, _ := json.MarshalIndent(c, "", "  ")
	return append(b, '\n')
}
