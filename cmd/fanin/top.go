package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/sdk"
)

func topCmd() *cobra.Command {
	var f apiFlags
	var interval time.Duration
	var iterations int
	var plain bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "A live view of jobs and the runtime pool, redrawn every second",
		Long: `top redraws, every --interval, the jobs (state, step, recent speed, gradient throughput, elastic
workers live/target, rejections), each elastic worker with the ranks it holds, the runtimes of the
pool (shards, how busy) and the autoscaler's latest decision. Ctrl-C stops it.
The pool and decisions need the admin token; with another token top shows its jobs only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return errors.New("--interval must be > 0")
			}
			a, out := f.admin(), cmd.OutOrStdout()
			for i := 0; iterations == 0 || i < iterations; i++ {
				if i > 0 {
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(interval):
					}
				}
				frame, err := topFrame(cmd.Context(), a, f.api, time.Now())
				var ae *sdk.APIError
				if i == 0 && errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden) {
					return err
				}
				if err != nil {
					frame = append(frame, fmt.Sprintf("\nerror: %v\n", err)...)
				}
				if plain {
					fmt.Fprintf(out, "%s\n", frame)
				} else {
					fmt.Fprintf(out, "\x1b[H\x1b[2J%s", frame) // home, clear, draw
				}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between redraws")
	cmd.Flags().IntVar(&iterations, "iterations", 0, "stop after this many redraws (0: until Ctrl-C)")
	cmd.Flags().BoolVar(&plain, "plain", false, "no ANSI: print each view after the previous one")
	return f.checked(cmd)
}

// topFrame renders one view. The pool and decision sections are left out for tokens that may not
// read them.
func topFrame(ctx context.Context, a *sdk.Admin, api string, now time.Time) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var b bytes.Buffer
	fmt.Fprintf(&b, "fanin top  %s  %s\n\n", api, now.Format(time.TimeOnly))
	sts, err := a.JobStatuses(ctx)
	if err != nil {
		return b.Bytes(), err
	}
	running := 0
	for _, st := range sts {
		if st.State == "running" {
			running++
		}
	}
	fmt.Fprintf(&b, "JOBS  %d (%d running)\n", len(sts), running)
	tw := newTable(&b)
	fmt.Fprintln(tw, "ID\tSTATE\tSTEP\tSTEPS/S\tGRAD/S\tSHARDS\tPLACED\tWORKERS\tREJECTS\tFUNCTION")
	for _, st := range sts {
		// StepsPerSecond is recent (view.JobRate: over the last rate.Window), so a change of speed shows.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\t%d\t%d\t%s\t%d\t%s\n", st.Spec.ID, st.State, stepText(st.Step), st.StepsPerSecond,
			human(st.BytesPerSecond), st.Layout.NumShards(), st.Placed, workersText(st), st.Rejects, st.Spec.Function.Name)
	}
	_ = tw.Flush()
	if err := topWorkers(ctx, &b, a, sts); err != nil {
		return b.Bytes(), err
	}

	pool, err := a.Pool(ctx)
	if sdk.IsForbidden(err) {
		return b.Bytes(), nil
	}
	if err != nil {
		return b.Bytes(), err
	}
	fmt.Fprintf(&b, "\nPOOL  %d runtimes, %d of %d shards placed\n", len(pool.Runtimes), pool.Placed, pool.Shards)
	tw = newTable(&b)
	fmt.Fprintln(tw, "RUNTIME\tCORES\tSHARDS\tBUSY\t")
	for _, r := range pool.Runtimes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%3.0f%%\t%s\n", r.ID, r.Cores, r.Shards, 100*r.Utilization, bar(r.Utilization, 20))
	}
	_ = tw.Flush()
	ds, err := a.Decisions(ctx, 1)
	if err != nil {
		return b.Bytes(), err
	}
	if len(ds) > 0 {
		d := ds[len(ds)-1]
		fmt.Fprintf(&b, "\nAUTOSCALER  %s mode, wants %d runtimes (demand %.2f cores) since %s\n", d.Mode, d.Desired, d.Demand, d.At.Local().Format(time.TimeOnly))
		for _, r := range d.Reasons {
			fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(r))
		}
	}
	return b.Bytes(), nil
}

// topWorkers lists the elastic workers of the jobs that have some: per worker, its ranks, step and
// last beat.
func topWorkers(ctx context.Context, b *bytes.Buffer, a *sdk.Admin, sts []api.JobStatus) error {
	var tw *tabwriter.Writer
	for _, st := range sts {
		if st.LiveWorkers == 0 {
			continue
		}
		ws, err := a.Workers(ctx, st.Spec.ID)
		if sdk.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return err
		}
		if tw == nil {
			fmt.Fprintf(b, "\nWORKERS\n")
			tw = newTable(b)
			fmt.Fprintln(tw, "JOB\tWORKER\tHOST\tRANKS\tSTEP\tLAST BEAT\tSTANDBY")
		}
		for _, w := range ws.Workers {
			standby := "-"
			if w.Standby {
				standby = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s ago\t%s\n", ws.Job, w.ID, orDash(w.Host), rankList(w.Ranks), w.Step,
				ago(time.Duration(w.BeatAgeMs*float64(time.Millisecond))), standby)
		}
		if len(ws.Unassigned) > 0 {
			fmt.Fprintf(tw, "%s\t(unassigned)\t-\t%s\t-\t-\t-\n", ws.Job, rankList(ws.Unassigned))
		}
	}
	if tw != nil {
		return tw.Flush()
	}
	return nil
}

// bar draws a fraction as a bar of width cells.
func bar(frac float64, width int) string {
	n := int(frac*float64(width) + 0.5)
	n = max(0, min(width, n))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}
