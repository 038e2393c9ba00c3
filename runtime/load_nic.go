package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strconv"
	"strings"
)

// The node's network: where a runtime's shards' bytes are counted against a NIC (docs/AUTOSCALING.md,
// "Nodes and NICs").

// WithNode labels the machine the runtime runs on (default: the name of the NATS server it is
// connected to). Runtimes with one label share one NIC in the autoscaler's load model.
func WithNode(node string) Option {
	return func(r *Runtime) error { r.node = node; return nil }
}

// WithNICBandwidth sets the node's network bandwidth each way, in bytes per second, that the
// runtime reports; 0 (the default) means unknown, which the autoscaler takes as no limit.
func WithNICBandwidth(bytesPerSec float64) Option {
	return func(r *Runtime) error {
		if !(bytesPerSec >= 0) || math.IsInf(bytesPerSec, 0) {
			return fmt.Errorf("NIC bandwidth must be a finite number of bytes per second >= 0, got %v", bytesPerSec)
		}
		r.nic = bytesPerSec
		return nil
	}
}

// ErrBandwidth is wrapped by ParseBandwidth's errors.
var ErrBandwidth = errors.New("invalid bandwidth")

// bandwidthUnits are ParseBandwidth's units, in bytes per second. Bits are decimal, as link speeds
// are (100Mbit = 100e6 bits/s); bytes too (MB = 1e6 bytes).
var bandwidthUnits = map[string]float64{
	"bit": 1.0 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
	"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseBandwidth reads a bandwidth such as "100Mbit", "10Gbit", "2.5gbit", "125MB" (bytes) or "0"
// (unknown), with an optional "/s", into bytes per second.
func ParseBandwidth(s string) (float64, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "/s")
	if t == "0" {
		return 0, nil
	}
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i <= 0 {
		return 0, fmt.Errorf("%w %q: want a number and a unit, e.g. 100Mbit, 10Gbit, 125MB, or 0 for unknown", ErrBandwidth, s)
	}
	v, err := strconv.ParseFloat(t[:i], 64)
	if err != nil || v < 0 || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%w %q: %q is not a number >= 0", ErrBandwidth, s, t[:i])
	}
	unit, ok := bandwidthUnits[strings.ToLower(t[i:])]
	if !ok || t[i:] == "b" { // "b" alone is ambiguous: bits or bytes
		return 0, fmt.Errorf("%w %q: unknown unit %q (bit, kbit, Mbit, Gbit, Tbit; B, kB, MB, GB, TB)", ErrBandwidth, s, t[i:])
	}
	return v * unit, nil
}

// LinkBandwidth is the speed of the interface of the default route, in bytes per second, as the
// kernel reports it under sys (/proc/net/route and /sys/class/net/<dev>/speed, in Mbit/s): the
// interface name and 0 when it is not known (no default route, a virtual interface, speed -1).
// sys is the root file system, e.g. os.DirFS("/").
func LinkBandwidth(sys fs.FS) (dev string, bytesPerSec float64) {
	dev = defaultRouteDev(sys)
	if dev == "" {
		return "", 0
	}
	b, err := fs.ReadFile(sys, "sys/class/net/"+dev+"/speed")
	if err != nil {
		return dev, 0
	}
	mbit, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil || mbit <= 0 {
		return dev, 0
	}
	return dev, mbit * 1e6 / 8
}

// defaultRouteDev is the interface of the default route (destination 0.0.0.0) in /proc/net/route,
// the one with the lowest metric, or "".
func defaultRouteDev(sys fs.FS) string {
	f, err := sys.Open("proc/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	best, bestMetric := "", int64(math.MaxInt64)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[1] != "00000000" || fields[7] != "00000000" {
			continue
		}
		if metric, err := strconv.ParseInt(fields[6], 10, 64); err == nil && metric < bestMetric {
			best, bestMetric = fields[0], metric
		}
	}
	return best
}
