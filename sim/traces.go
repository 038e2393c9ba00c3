package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Traces are the real cluster traces a workload is drawn from: every CSV file of a trace
// directory, each in one of the two formats of ../shared/traces (see its README), told apart by
// their header rows:
//
//   - a PAI mini-batch trace: columns worker, time and batch_time_norm (others, such as the row
//     index and gpu, are ignored), one row per worker and iteration. pai-minibatch-job_<n>_norm.csv
//     is the trace "pai-<n>"; any other file is the trace named by its file name without .csv.
//   - a run-time trace: one column, runtime (seconds). Several such files are read as one, in
//     file name order.
//
// Files that do not end in .csv (the README) are not traces; a CSV file in neither format is an
// error, so that no trace is left out unnoticed.
type Traces struct {
	// PAI maps a trace name ("pai-1", ..., or a file's own name) to its iterations: for each sampled
	// iteration, the normalized (0-1000) mini-batch time of each worker, workers in rank order.
	PAI map[string][][]float64
	// Philly holds job run times in seconds.
	Philly []float64
	// Files are the files read, in name order.
	Files []TraceFile
}

// TraceFile is one file a Traces was read from.
type TraceFile struct {
	Name  string // file name, without the directory
	Trace string // the PAI trace's name; "" for a run-time trace
	// Rows is the number of iterations of a PAI trace (Workers each), or of run times.
	Rows, Workers int
}

// String says what the file is, e.g. "pai-minibatch-job_1_norm.csv (pai-1: 300 iterations of 10
// workers)".
func (f TraceFile) String() string {
	if f.Trace == "" {
		return fmt.Sprintf("%s (%d run times)", f.Name, f.Rows)
	}
	return fmt.Sprintf("%s (%s: %d iterations of %d workers)", f.Name, f.Trace, f.Rows, f.Workers)
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

// ErrNoTraces says the trace directory is missing or holds no trace a workload needs.
var ErrNoTraces = errors.New("traces not found")

// paiFileName is the name of the shared PAI traces' files: pai-minibatch-job_<n>_norm.csv.
var paiFileName = regexp.MustCompile(`^pai-minibatch-job_([0-9]+)_norm\.csv$`)

// LoadTraces reads every trace file of dir (Traces says which files and formats). It fails with
// ErrNoTraces when dir is missing or holds no trace file.
func LoadTraces(dir string) (*Traces, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoTraces, dir)
	}
	if err != nil {
		return nil, err
	}
	t := &Traces{PAI: map[string][][]float64{}}
	from := map[string]string{} // PAI trace -> its file
	for _, e := range entries { // in file name order
		name := e.Name()
		if e.IsDir() || !strings.EqualFold(filepath.Ext(name), ".csv") {
			continue
		}
		path := filepath.Join(dir, name)
		rows, err := openCSV(path)
		if err != nil {
			return nil, err
		}
		switch {
		case isPAI(rows[0]):
			it, err := readPAI(path, rows)
			if err != nil {
				return nil, err
			}
			trace := strings.TrimSuffix(name, filepath.Ext(name))
			if m := paiFileName.FindStringSubmatch(name); m != nil {
				trace = "pai-" + m[1]
			}
			if other, dup := from[trace]; dup {
				return nil, fmt.Errorf("%s: trace %q is %s already", path, trace, other)
			}
			from[trace] = name
			t.PAI[trace] = it
			t.Files = append(t.Files, TraceFile{Name: name, Trace: trace, Rows: len(it), Workers: len(it[0])})
		case len(rows[0]) == 1 && strings.TrimSpace(rows[0][0]) == "runtime":
			rt, err := readPhilly(path, rows)
			if err != nil {
				return nil, err
			}
			t.Philly = append(t.Philly, rt...)
			t.Files = append(t.Files, TraceFile{Name: name, Rows: len(rt)})
		default:
			return nil, fmt.Errorf("%s: line 1: not a trace: want a PAI mini-batch trace (columns worker, time, "+
				"batch_time_norm) or run times (one column, runtime), got the columns %q", path, rows[0])
		}
	}
	if len(t.Files) == 0 {
		return nil, fmt.Errorf("%w: no trace file (*.csv) in %s", ErrNoTraces, dir)
	}
	return t, nil
}

// isPAI says whether a header row is a PAI mini-batch trace's.
func isPAI(header []string) bool {
	n := 0
	for _, h := range header {
		switch strings.TrimSpace(h) {
		case "worker", "time", "batch_time_norm":
			n++
		}
	}
	return n == 3
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
	var rows [][]string
	for {
		row, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err) // a csv.ParseError names the line
		}
		rows = append(rows, row)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no data", path)
	}
	return rows, nil
}

// readPAI reads rows of (index, worker, gpu, time, batch_time_norm). A worker missing from an
// iteration keeps its time of the previous iteration (its median over the trace for the first).
func readPAI(path string, rows [][]string) ([][]float64, error) {
	col := map[string]int{}
	for i, h := range rows[0] {
		col[strings.TrimSpace(h)] = i
	}
	type key struct{ it, w int }
	val := map[key]float64{}
	var its, workers []int
	for n, r := range rows[1:] {
		if len(r) != len(rows[0]) {
			return nil, fmt.Errorf("%s: line %d: %d fields, want %d", path, n+2, len(r), len(rows[0]))
		}
		w, e1 := strconv.Atoi(r[col["worker"]])
		it, e2 := strconv.Atoi(r[col["time"]])
		v, e3 := strconv.ParseFloat(r[col["batch_time_norm"]], 64)
		if err := errors.Join(e1, e2, e3); err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", path, n+2, err)
		}
		if w < 0 || !(v > 0) {
			return nil, fmt.Errorf("%s: line %d: want a worker >= 0 and a batch time > 0", path, n+2)
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

func readPhilly(path string, rows [][]string) ([]float64, error) {
	out := make([]float64, 0, len(rows)-1)
	for n, r := range rows[1:] {
		if len(r) == 0 || r[0] == "" {
			continue
		}
		v, err := strconv.ParseFloat(r[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", path, n+2, err)
		}
		out = append(out, v)
	}
	return out, nil
}
