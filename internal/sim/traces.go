package sim

import (
	"encoding/csv"
	"errors"
	"fmt"

	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// Trace files, as in ../shared/traces (see its README).
var paiFiles = []string{"pai-minibatch-job_1_norm.csv", "pai-minibatch-job_2_norm.csv", "pai-minibatch-job_3_norm.csv"}

const phillyFile = "philly-job-runtime.csv"

// Traces are the real cluster traces a workload is drawn from.
type Traces struct {
	// PAI maps a trace name ("pai-1", "pai-2", "pai-3") to its iterations: for each sampled
	// iteration, the normalized (0-1000) mini-batch time of each worker, workers in rank order.
	PAI map[string][][]float64
	// Philly holds job run times in seconds.
	Philly []float64
}

// PAINames lists the PAI traces in a fixed order.
func (t *Traces) PAINames() []string {
	names := make([]string, 0, len(t.PAI))
	for n := range t.PAI {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ErrNoTraces says the trace directory is missing or incomplete.
var ErrNoTraces = errors.New("traces not found")

// LoadTraces reads the PAI mini-batch traces and the Philly run times from dir.
func LoadTraces(dir string) (*Traces, error) {
	t := &Traces{PAI: map[string][][]float64{}}
	for i, name := range paiFiles {
		it, err := readPAI(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		t.PAI["pai-"+strconv.Itoa(i+1)] = it
	}
	rt, err := readPhilly(filepath.Join(dir, phillyFile))
	if err != nil {
		return nil, err
	}
	t.Philly = rt
	return t, nil
}

func openCSV(path string) ([][]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoTraces, path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no data", path)
	}
	return rows, nil
}

// readPAI reads rows of (index, worker, gpu, time, batch_time_norm). A worker missing from an
// iteration keeps its time of the previous iteration (its median over the trace for the first).
func readPAI(path string) ([][]float64, error) {
	rows, err := openCSV(path)
	if err != nil {
		return nil, err
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range []string{"worker", "time", "batch_time_norm"} {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("%s: no column %q", path, h)
		}
	}
	type key struct{ it, w int }
	val := map[key]float64{}
	var its, workers []int
	for n, r := range rows[1:] {
		w, e1 := strconv.Atoi(r[col["worker"]])
		it, e2 := strconv.Atoi(r[col["time"]])
		v, e3 := strconv.ParseFloat(r[col["batch_time_norm"]], 64)
		if err := errors.Join(e1, e2, e3); err != nil {
			return nil, fmt.Errorf("%s: row %d: %w", path, n+2, err)
		}
		val[key{it, w}] = v
		its = append(its, it)
		workers = append(workers, w)
	}
	slices.Sort(its)
	its = slices.Compact(its)
	slices.Sort(workers)
	workers = slices.Compact(workers)
	out := make([][]float64, len(its))
	for wi, w := range workers {
		var present []float64
		for _, it := range its {
			if v, ok := val[key{it, w}]; ok {
				present = append(present, v)
			}
		}
		slices.Sort(present)
		last := present[len(present)/2]
		for i, it := range its {
			if out[i] == nil {
				out[i] = make([]float64, len(workers))
			}
			if v, ok := val[key{it, w}]; ok {
				last = v
			}
			out[i][wi] = last
		}
	}
	return out, nil
}

func readPhilly(path string) ([]float64, error) {
	rows, err := openCSV(path)
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, len(rows)-1)
	for n, r := range rows[1:] {
		if len(r) == 0 || r[0] == "" {
			continue
		}
		v, err := strconv.ParseFloat(r[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: row %d: %w", path, n+2, err)
		}
		out = append(out, v)
	}
	return out, nil
}
