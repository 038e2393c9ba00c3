package bench

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// analysis is what limits each figure, from the profiles of the last full run (analysis.md beside
// this file): kept with the code so that regenerating docs/BENCHMARKS.md keeps it.
//
//go:embed analysis.md
var analysis string

// Markdown renders results as the body of docs/BENCHMARKS.md: the command that produced them,
// the environment (see Environment), a summary, a section per scenario, and the analysis.
func Markdown(results []Result, command string, env string) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("fanin's data plane against baselines measured in the same run, on the same machine and the same bytes.\n")
	b.WriteString("This file is generated (the last section, \"Measured elsewhere\", is written by hand and kept by `--out`):\n")
	b.WriteString("change `lab/bench` (the analysis is `lab/bench/analysis.md`) and run the command again.\n\n")
	fmt.Fprintf(&b, "Produced by:\n\n```\n%s\n```\n\n", command)
	b.WriteString("## Environment\n\n")
	b.WriteString(strings.TrimSpace(env) + "\n\n")

	b.WriteString("## Summary\n\n")
	b.WriteString("Ratio is fanin / baseline. For throughputs higher is better and the goal is a minimum ratio; for\n")
	b.WriteString("latencies lower is better and the goal, where the issue sets one, is a maximum ratio.\n\n")
	b.WriteString("| scenario | case | metric | fanin | baseline | ratio | goal | met? |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Scenario, r.Case, r.Metric,
			fig(r, r.Fanin), fig(r, r.Base), ratio(r), goal(r), met(r))
	}
	b.WriteString("\nCPU columns below: process CPU time (user + system of every goroutine: NATS server, runtimes,\n")
	b.WriteString("workers, aggregators; plus redis-server's for the Redis baseline) per step or per kernel pass;\n")
	b.WriteString("\"fanin function time\" is what fanin's runtimes spent in `Func.Apply` per step.\n\n")

	for _, sc := range scenarios {
		var rs []Result
		for _, r := range results {
			if r.Scenario == sc.name {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n%s.\n\n", sc.name, upperFirst(sc.doc))
		var bases, setups []string
		cpu := false
		for _, r := range rs {
			if r.Baseline != "" && !slices.Contains(bases, r.Baseline) {
				bases = append(bases, r.Baseline)
			}
			if r.Setup != "" && !slices.Contains(setups, r.Setup) {
				setups = append(setups, r.Setup)
			}
			cpu = cpu || r.FaninCPU != 0 || r.BaseCPU != 0 || r.FuncTime != 0
		}
		if len(bases) > 0 {
			fmt.Fprintf(&b, "Baseline: %s.\n\n", strings.Join(bases, "; "))
		}
		for _, st := range setups {
			fmt.Fprintf(&b, "Setup: %s.\n\n", st)
		}
		b.WriteString("| case | metric | fanin | baseline | ratio | goal | met? |")
		if cpu {
			b.WriteString(" CPU fanin | CPU baseline | fanin function time |")
		}
		b.WriteString("\n|---|---|---:|---:|---:|---|---|")
		if cpu {
			b.WriteString("---:|---:|---:|")
		}
		b.WriteString("\n")
		for _, r := range rs {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |", r.Case, r.Metric,
				fig(r, r.Fanin), fig(r, r.Base), ratio(r), goal(r), met(r))
			if cpu {
				fmt.Fprintf(&b, " %s | %s | %s |", dur(r.FaninCPU), dur(r.BaseCPU), dur(r.FuncTime))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
		// Each distinct note once, with the cases it is about.
		var notes []string
		cases := map[string][]string{}
		for _, r := range rs {
			n := r.Notes
			switch {
			case r.Skipped != "":
				n = "**skipped**: " + r.Skipped
			case r.Err != "":
				n = "**failed**: " + r.Err
			}
			if n == "" {
				continue
			}
			if _, ok := cases[n]; !ok {
				notes = append(notes, n)
			}
			cases[n] = append(cases[n], r.Case)
		}
		for _, n := range notes {
			fmt.Fprintf(&b, "- %s: %s\n", strings.Join(cases[n], ", "), n)
		}
		if len(notes) > 0 {
			b.WriteString("\n")
		}
	}
	b.WriteString(strings.TrimSpace(analysis) + "\n")
	return b.String()
}

// HandWritten is the heading of the hand-written section at the end of docs/BENCHMARKS.md: figures
// measured by other commands, copied there so that one page has every figure.
const HandWritten = "## Measured elsewhere"

// KeepHandWritten returns md followed by the hand-written section of old (from HandWritten to its
// end), if old has one: regenerating the file keeps it.
func KeepHandWritten(md, old string) string {
	i := strings.Index(old, "\n"+HandWritten)
	if i < 0 {
		return md
	}
	return strings.TrimRight(md, "\n") + "\n" + old[i:]
}

// KeepScenarios carries over from old, the report of an earlier run, the summary rows and the
// sections of the scenarios this run did not run (a run with --only; ran names those it ran), each
// marked as carried over, so that one page keeps every figure.
// The marks of a carried-over section and of its summary rows.
const (
	carriedMark = "*Not run by this report's command: carried over from "
	earlierRun  = " (earlier run: see its section)"
)

func KeepScenarios(md, old string, ran []string) string {
	from := "the previous version of this file"
	for _, l := range strings.Split(old, "\n") {
		if d, ok := strings.CutPrefix(l, "- date: "); ok {
			from += " (dated " + strings.TrimSpace(d) + "; a section that names its own run comes from that run)"
			break
		}
	}
	names := Scenarios()
	for i, sc := range names {
		if slices.Contains(ran, sc) || strings.Contains(md, "\n## "+sc+"\n") {
			continue
		}
		body, ok := section(old, sc)
		if !ok {
			continue
		}
		// The section goes before the next scenario's that md has, else before the analysis.
		at := -1
		for _, next := range names[i+1:] {
			if j := strings.Index(md, "\n## "+next+"\n"); j >= 0 {
				at = j + 1
				break
			}
		}
		if at < 0 {
			if j := strings.Index(md, "\n## What limits each figure"); j >= 0 {
				at = j + 1
			} else {
				at = len(md)
			}
		}
		head, rest, _ := strings.Cut(body, "\n\n")
		if !strings.HasPrefix(rest, carriedMark) { // carried over before: it keeps its first mark
			body = head + "\n\n" + carriedMark + from + ".*\n\n" + rest
		}
		md = md[:at] + body + md[at:]
		// Its summary rows, at the end of the summary table.
		var rows []string
		for _, l := range strings.Split(old, "\n") {
			if cells, ok := strings.CutPrefix(l, "| "+sc+" | "); ok {
				c, more, _ := strings.Cut(cells, " | ")
				if !strings.HasSuffix(c, earlierRun) {
					c += earlierRun
				}
				rows = append(rows, "| "+sc+" | "+c+" | "+more)
			}
		}
		if len(rows) == 0 {
			continue
		}
		sum := strings.Index(md, "\n## Summary\n")
		tbl := strings.Index(md[max(sum, 0):], "\n|---")
		if sum < 0 || tbl < 0 {
			continue
		}
		end := strings.Index(md[sum+tbl+1:], "\n\n")
		if end < 0 {
			continue
		}
		end += sum + tbl + 1
		md = md[:end] + "\n" + strings.Join(rows, "\n") + md[end:]
	}
	return md
}

// section is the "## name" section of a report, up to the next "## " heading.
func section(md, name string) (string, bool) {
	i := strings.Index(md, "\n## "+name+"\n")
	if i < 0 {
		return "", false
	}
	body := md[i+1:]
	if j := strings.Index(body[3:], "\n## "); j >= 0 {
		body = body[:3+j+1]
	}
	return body, true
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func fig(r Result, v float64) string {
	if r.Skipped != "" || r.Err != "" {
		return "—"
	}
	return num(v)
}

func ratio(r Result) string {
	switch {
	case r.Skipped != "":
		return "skipped"
	case r.Err != "":
		return "failed"
	}
	s := fmt.Sprintf("%.2fx", r.Ratio)
	if r.LowerIsBetter {
		s += " (lower is better)"
	}
	return s
}

func goal(r Result) string {
	if r.Goal == 0 {
		return "—"
	}
	return fmt.Sprintf("%s %.2gx", goalOp(r), r.Goal)
}

func met(r Result) string {
	switch {
	case r.Skipped != "" || r.Err != "":
		return "—"
	case r.Goal == 0:
		return "n/a"
	case r.Met:
		return "yes"
	}
	return "**no**"
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// Environment describes the machine and the software of a run, as a Markdown list: date, CPU,
// cores, memory, Go, NATS server, redis-server.
func Environment(cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- machine: %s, %d logical CPUs (GOMAXPROCS %d), %s RAM, %s/%s\n",
		cpuModel(), goruntime.NumCPU(), goruntime.GOMAXPROCS(0), memTotal(), goruntime.GOOS, goruntime.GOARCH)
	fmt.Fprintf(&b, "- Go %s; NATS server %s embedded in the same process (fanin's `internal/embed` configuration)\n",
		strings.TrimPrefix(goruntime.Version(), "go"), server.VERSION)
	if bin, err := findRedis(cfg); err == nil {
		out, _ := exec.Command(bin, "--version").Output()
		fmt.Fprintf(&b, "- %s\n", strings.TrimSpace(string(out)))
	} else if errors.Is(err, ErrRedisNotBuilt) {
		fmt.Fprintf(&b, "- no Redis baseline: %v\n", err)
	} else {
		fmt.Fprintf(&b, "- no redis-server: %v\n", err)
	}
	b.WriteString("- everything (servers, runtimes, workers, baselines) runs on this machine over loopback, in one process\n")
	b.WriteString("  or in processes of their own as each scenario's setup says (the cluster scenario: in network\n")
	b.WriteString("  namespaces joined by capped links); the machine's cores are shared by all of it\n")
	return b.String()
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
			}
		}
	}
	return "unknown"
}
