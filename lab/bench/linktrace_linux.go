package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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

// traceLinks starts reading every node's link counters each linkTraceEvery until the returned
// stop is called; stop returns the trace, or why the counters could not be read. One thread in
// the switch's namespace reads them all at once from its /proc/thread-self/net/dev, kept open: a
// node's link is its port on the switch (the port sends what the node receives). A thread per node,
// opening the file at each read, cost the bench's process half its CPU in a cluster case, on the
// 2 cores that the emulated nodes share. The first reading is taken before traceLinks returns, the
// last when stop is called.
func traceLinks(lab *netLab) (stop func() (linkTrace, error)) {
	t := linkTrace{every: linkTraceEvery, samples: make([][]linkSample, len(lab.nodes))}
	for _, n := range lab.nodes {
		t.nodes, t.mbit = append(t.nodes, n.Name), append(t.mbit, n.Mbit)
	}
	done, started, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	first := started // closed, then nil, by the reader
	var err error
	t0 := time.Now()
	sw := &netNode{Name: "switch", NS: lab.sw}
	go func() { // owned by stop, which waits for it
		defer close(finished)
		err = sw.do(func() error {
			f, err := os.Open("/proc/thread-self/net/dev")
			if err != nil {
				return err
			}
			defer f.Close()
			tick := time.NewTicker(linkTraceEvery)
			defer tick.Stop()
			var buf []byte
			for last := false; ; {
				if buf, err = reread(f, buf); err != nil {
					return err
				}
				at := time.Since(t0)
				for i, n := range lab.nodes {
					b, err := parseNetDev(buf, n.port)
					if err != nil {
						return fmt.Errorf("node %s: %w", n.Name, err)
					}
					t.samples[i] = append(t.samples[i], linkSample{at, b.tx, b.rx})
				}
				if first != nil {
					close(first)
					first = nil
				}
				if last {
					return nil
				}
				select {
				case <-done:
					last = true // one more reading: the trace ends when stop is called
				case <-tick.C:
				}
			}
		})
	}()
	select { // the first reading, or the error that stop returns
	case <-started:
	case <-finished:
	}
	return func() (linkTrace, error) {
		close(done)
		<-finished
		return t, err
	}
}

// reread reads f again from its start into buf's storage.
func reread(f *os.File, buf []byte) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
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
