package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A linkTrace is every node's link counters sampled through a measurement's timed steps: what the
// counters read at the start and the end cannot tell, whether the links were busy all the time or
// full at times and idle at others (a step's last parameters leaving one node while the others
// wait for them).
type linkTrace struct {
	every   time.Duration
	nodes   []string
	mbit    []int
	samples [][]linkSample // per node
}

type linkSample struct {
	at     time.Duration // since the trace began
	rx, tx uint64        // the counters, as read
}

// linkTraceEvery is how often the trace reads the counters: a step at 100 Mbit/s lasts about a
// second, and a step's boundary a few hundred milliseconds.
const linkTraceEvery = 10 * time.Millisecond

// traceLinks starts reading every node's link counters each linkTraceEvery, from a thread in the
// node's namespace (its /proc/thread-self/net/dev), until the returned stop is called; stop returns
// the trace, or why a node's counters could not be read.
func traceLinks(lab *netLab) (stop func() (linkTrace, error)) {
	t := linkTrace{every: linkTraceEvery, samples: make([][]linkSample, len(lab.nodes))}
	for _, n := range lab.nodes {
		t.nodes, t.mbit = append(t.nodes, n.Name), append(t.mbit, n.Mbit)
	}
	done := make(chan struct{})
	errs := make([]error, len(lab.nodes))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, n := range lab.nodes {
		wg.Go(func() {
			errs[i] = n.do(func() error {
				tick := time.NewTicker(linkTraceEvery)
				defer tick.Stop()
				for {
					b, err := readNetDev(netLabIf)
					if err != nil {
						return fmt.Errorf("node %s: %w", n.Name, err)
					}
					t.samples[i] = append(t.samples[i], linkSample{time.Since(t0), b.rx, b.tx})
					select {
					case <-done:
						return nil
					case <-tick.C:
					}
				}
			})
		})
	}
	return func() (linkTrace, error) {
		close(done)
		wg.Wait()
		return t, errors.Join(errs...)
	}
}

// readNetDev reads dev's byte counters from /proc/thread-self/net/dev: those of the calling
// thread's network namespace.
func readNetDev(dev string) (linkBytes, error) {
	data, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return linkBytes{}, err
	}
	return parseNetDev(data, dev)
}

// parseNetDev finds dev's line in /proc/net/dev's text: after "dev:", received bytes are the first
// field and transmitted bytes the ninth.
func parseNetDev(data []byte, dev string) (linkBytes, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			return linkBytes{}, fmt.Errorf("net/dev: %s has %d fields", dev, len(f))
		}
		rx, err1 := strconv.ParseUint(f[0], 10, 64)
		tx, err2 := strconv.ParseUint(f[8], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return linkBytes{}, fmt.Errorf("net/dev: %s: %w", dev, err)
		}
		return linkBytes{rx, tx}, nil
	}
	return linkBytes{}, fmt.Errorf("net/dev: no %s", dev)
}

// linkUse is what a trace says of some nodes' links, from the first bin of time in which they
// carried something to the last: the mean share of their capacity (both ways) used, and the share
// of the bins in which they carried less than half of it.
type linkUse struct {
	mean, belowHalf float64
}

// use sums the trace up over the nodes whose name starts with prefix, in bins of bin; false if
// nothing was traced.
func (t linkTrace) use(prefix string, bin time.Duration) (linkUse, bool) {
	var idx []int
	for i, n := range t.nodes {
		if strings.HasPrefix(n, prefix) && len(t.samples[i]) > 1 {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return linkUse{}, false
	}
	end := t.samples[idx[0]][len(t.samples[idx[0]])-1].at
	for _, i := range idx {
		end = min(end, t.samples[i][len(t.samples[i])-1].at)
	}
	bins := int(end / bin)
	if bins == 0 {
		return linkUse{}, false
	}
	// Each node's bytes in each bin, both ways, as a share of what its link carries in a bin: the
	// counters at a bin's edges are interpolated between the samples either side (on a loaded
	// machine the sampler falls behind, and a bin may hold no sample).
	share := make([]float64, bins)
	for _, i := range idx {
		s := t.samples[i]
		perBin := float64(t.mbit[i]) * 1e6 / 8 * bin.Seconds() * 2
		at := func(d time.Duration) float64 { // rx+tx at d
			k := sort.Search(len(s), func(k int) bool { return s[k].at >= d })
			switch {
			case k == 0:
				return float64(s[0].rx + s[0].tx)
			case k == len(s):
				return float64(s[k-1].rx + s[k-1].tx)
			}
			a, z := s[k-1], s[k]
			f := float64(d-a.at) / float64(z.at-a.at)
			return float64(a.rx+a.tx) + f*(float64(z.rx+z.tx)-float64(a.rx+a.tx))
		}
		for b := range bins {
			moved := at(time.Duration(b+1)*bin) - at(time.Duration(b)*bin)
			share[b] += moved / perBin / float64(len(idx))
		}
	}
	// From the first bin that carried something to the last: not the processes' start and end.
	first, last := 0, bins-1
	for first < bins && share[first] < linkIdle {
		first++
	}
	for last >= first && share[last] < linkIdle {
		last--
	}
	if first > last {
		return linkUse{}, false
	}
	var low int
	var sum float64
	for _, x := range share[first : last+1] {
		sum += x
		if x < 0.5 {
			low++
		}
	}
	n := float64(last + 1 - first)
	return linkUse{mean: sum / n, belowHalf: float64(low) / n}, true
}

// linkIdle is the use below which a bin at the start or end of a trace is taken as before the
// first step or after the last.
const linkIdle = 0.05

// String says it for a report.
func (u linkUse) String() string {
	return fmt.Sprintf("%.0f%% of their capacity used, below half of it %.0f%% of the time", 100*u.mean, 100*u.belowHalf)
}

// write writes the trace as a tab-separated file: a line per sample and node, with the counters
// as read (bytes since the interface came up).
func (t linkTrace) write(path string) error {
	var b strings.Builder
	b.WriteString("t_ms\tnode\tmbit\trx_bytes\ttx_bytes\n")
	for i, ss := range t.samples {
		for _, s := range ss {
			fmt.Fprintf(&b, "%.1f\t%s\t%d\t%d\t%d\n", float64(s.at)/1e6, t.nodes[i], t.mbit[i], s.rx, s.tx)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
