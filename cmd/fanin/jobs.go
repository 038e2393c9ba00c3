package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/wire"
)

func jobsCmd() *cobra.Command {
	var f apiFlags
	cmd := &cobra.Command{Use: "jobs", Short: "Create, list, inspect, pause, scale and delete jobs through the gateway"}
	f.register(cmd)

	var file, credsDir string
	create := &cobra.Command{
		Use:   "create -f spec.yaml",
		Short: "Create a job from a JSON or YAML spec ('-' reads standard input)",
		Long: `Create a job. The answer holds the job's token (reaches only this job) and its workers' NATS
credentials; they are shown once. With --creds-dir the credentials are written to
<dir>/<job>.creds (mode 0600) and the token to <dir>/<job>.token instead of being printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := readFileArg(cmd, file)
			if err != nil {
				return err
			}
			c, err := f.admin().SubmitJobRaw(cmd.Context(), data)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if credsDir != "" {
				if err := saveAccess(credsDir, c); err != nil {
					return err
				}
				c.Token = ""
				if c.Credentials != nil {
					c.Credentials.Seed, c.Credentials.Creds = "", ""
				}
			}
			if f.output == "json" {
				return printJSON(out, c)
			}
			if err := printJobs(out, []api.JobStatus{{Record: c.Record, State: c.State, Owner: c.Owner, Quota: c.Quota, Step: 0}}); err != nil {
				return err
			}
			if credsDir != "" {
				fmt.Fprintf(out, "\ntoken and NATS credentials written to %s\n", credsDir)
				if c.Credentials != nil {
					fmt.Fprintf(out, "workers: nats --creds %s --inbox-prefix %s ...\n",
						filepath.Join(credsDir, c.Spec.ID+".creds"), c.Credentials.InboxPrefix)
				}
				return nil
			}
			if c.Token != "" {
				fmt.Fprintf(out, "\njob token (reaches only %s; shown once):\n  %s\n", c.Spec.ID, c.Token)
			}
			if c.Credentials != nil {
				fmt.Fprintf(out, "\nNATS credentials of its workers (shown once; inbox prefix %s):\n%s", c.Credentials.InboxPrefix, c.Credentials.Creds)
			}
			return nil
		},
	}
	create.Flags().StringVarP(&file, "file", "f", "", "spec file")
	create.Flags().StringVar(&credsDir, "creds-dir", "", "write the job's token and NATS credentials to this directory instead of printing them")
	_ = create.MarkFlagRequired("file")

	ls := &cobra.Command{
		Use: "ls", Short: "List jobs with their state, step and speed", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sts, err := f.admin().JobStatuses(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), sts)
			}
			return printJobs(cmd.OutOrStdout(), sts)
		},
	}
	get := &cobra.Command{
		Use: "get ID", Short: "Show one job: status and every shard's placement, step and lag", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := f.admin().JobStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), st)
			}
			return printJob(cmd.OutOrStdout(), st)
		},
	}
	rm := &cobra.Command{
		Use: "rm ID...", Short: "Delete jobs: drain them, then remove their streams, state and credentials", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := f.admin().DeleteJob(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", id)
			}
			return nil
		},
	}
	pause := &cobra.Command{
		Use: "pause ID", Short: "Take a job off the runtimes; its workers' gradients queue until resume", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := f.admin().PauseJob(cmd.Context(), args[0])
			return printState(cmd.OutOrStdout(), f.output, st, err)
		},
	}
	resume := &cobra.Command{
		Use: "resume ID", Short: "Place a paused (or throttled) job again", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := f.admin().ResumeJob(cmd.Context(), args[0])
			return printState(cmd.OutOrStdout(), f.output, st, err)
		},
	}
	workers := &cobra.Command{
		Use:   "workers ID",
		Short: "Show a job's elastic workers: the ranks each holds, its step and last beat, standby",
		Long: `Show a job's elastic workers as the autoscaler last assigned them: every live worker with the
logical ranks it holds, the step of its parameters, how long ago it last beat, and whether it stands
by (beyond the job's target worker count); the assignment's epoch, the target, and ranks no worker
holds. Set the target with 'fanin jobs scale'.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := f.admin().Workers(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), ws)
			}
			return printWorkers(cmd.OutOrStdout(), ws)
		},
	}
	var target int
	scale := &cobra.Command{
		Use:   "scale ID --workers N",
		Short: "Set a job's target count of elastic workers (0: every live worker holds ranks)",
		Long: `Set how many of a job's elastic workers hold its logical ranks: the first N to join do, the
others stand by and take over when one leaves. 0 lets every live worker hold ranks (at most one
per rank). N is at most the job's ranks. The autoscaler reassigns the ranks within a second.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := f.admin().SetWorkers(cmd.Context(), args[0], target)
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), ws)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: target %s; %d live workers as last assigned (fanin jobs workers %s)\n",
				ws.Job, targetText(ws.Target), ws.Live, ws.Job)
			return nil
		},
	}
	scale.Flags().IntVar(&target, "workers", 0, "target worker count, 0 to the job's ranks (0: every live worker)")
	_ = scale.MarkFlagRequired("workers")
	var limit int
	rejects := &cobra.Command{
		Use: "rejects ID", Short: "Show a job's rejected inputs: counts by reason and the latest ones", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rj, err := f.admin().Rejects(cmd.Context(), args[0], limit)
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), rj)
			}
			return printRejects(cmd.OutOrStdout(), rj)
		},
	}
	rejects.Flags().IntVar(&limit, "limit", 20, "latest rejections to show")
	var credsOut string
	creds := &cobra.Command{
		Use: "creds ID", Short: "Issue another set of NATS credentials for a job's workers", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.admin().NewCredentials(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if credsOut != "" {
				if err := os.WriteFile(credsOut, []byte(c.Creds), 0o600); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (user %s; inbox prefix %s)\n", credsOut, c.User, c.InboxPrefix)
				return nil
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), c)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# inbox prefix %s\n%s", c.InboxPrefix, c.Creds)
			return nil
		},
	}
	creds.Flags().StringVar(&credsOut, "out", "", "write the .creds file here (mode 0600) instead of printing it")
	cmd.AddCommand(create, ls, get, rm, pause, resume, workers, scale, rejects, creds)
	return f.checked(cmd)
}

func saveAccess(dir string, c *api.JobCreated) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if c.Token != "" {
		if err := os.WriteFile(filepath.Join(dir, c.Spec.ID+".token"), []byte(c.Token+"\n"), 0o600); err != nil {
			return err
		}
	}
	if c.Credentials != nil {
		if err := os.WriteFile(filepath.Join(dir, c.Spec.ID+".creds"), []byte(c.Credentials.Creds), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func printState(w io.Writer, output string, st *api.JobStatus, err error) error {
	if err != nil {
		return err
	}
	if output == "json" {
		return printJSON(w, st)
	}
	fmt.Fprintf(w, "%s %s at step %s\n", st.Spec.ID, st.State, stepText(st.Step))
	return nil
}

func printJobs(w io.Writer, sts []api.JobStatus) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tSTEP\tSTEPS/S\tRANKS\tWORKERS\tFUNCTION\tSHARDS\tPLACED\tGRAD/S\tREJECTS\tOWNER\tCREATED")
	for _, st := range sts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d\t%s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\n", st.Spec.ID, st.State, stepText(st.Step),
			st.StepsPerSecond, st.Spec.Ranks, workersText(st), st.Spec.Function.Name, st.Layout.NumShards(), st.Placed,
			human(st.BytesPerSecond), st.Rejects, orDash(st.Owner), st.Created.Local().Format("2006-01-02 15:04:05"))
	}
	return tw.Flush()
}

func printJob(w io.Writer, st *api.JobStatus) error {
	fmt.Fprintf(w, "job %s: %s, step %s, %.2f steps/s, %s/s of gradients, %d/%d shards placed, %d rejected inputs\n",
		st.Spec.ID, st.State, stepText(st.Step), st.StepsPerSecond, human(st.BytesPerSecond), st.Placed, len(st.Layout.Shards), st.Rejects)
	fmt.Fprintf(w, "  %d ranks, %s %v, %d parameters, %s storage, owner %s\n", st.Spec.Ranks, st.Spec.Function.Name,
		st.Spec.Function.Hyper, st.Layout.Elements, st.Spec.Storage, orDash(st.Owner))
	if q := st.Quota; q != (api.Quota{}) {
		fmt.Fprintf(w, "  quota: %d shards, %s/s\n", q.Shards, human(float64(q.BytesPerSecond)))
	}
	if st.LiveWorkers > 0 || st.Workers > 0 {
		fmt.Fprintf(w, "  elastic workers: %d live, target %s (fanin jobs workers %s)\n", st.LiveWorkers, targetText(st.Workers), st.Spec.ID)
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "SHARD\tBYTES\tRUNTIME\tEPOCH\tSTEP\tLAG\tPENDING\tQUEUE_MS\tPERIOD_MS")
	for _, s := range st.Shards {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%d\t%d\t%.1f\t%.1f\n", s.ID, s.Bytes, orDash(s.Runtime), s.Epoch, stepText(s.Step),
			s.Lag, s.Pending, s.QueueWaitMs, s.PeriodMs)
	}
	return tw.Flush()
}

// printWorkers prints a job's elastic workers.
func printWorkers(w io.Writer, ws *api.JobWorkers) error {
	fmt.Fprintf(w, "job %s: %d ranks, target %s; %d live workers, %d standing by; assignment epoch %d",
		ws.Job, ws.Ranks, targetText(ws.Target), ws.Live, ws.Standby, ws.Epoch)
	if ws.Updated != nil {
		fmt.Fprintf(w, ", written %s ago", ago(time.Since(*ws.Updated)))
	}
	fmt.Fprintln(w)
	if len(ws.Unassigned) > 0 {
		fmt.Fprintf(w, "  ranks no worker holds: %s\n", rankList(ws.Unassigned))
	}
	if len(ws.Workers) == 0 {
		fmt.Fprintln(w, "  no elastic worker")
		return nil
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "WORKER\tHOST\tPID\tRANKS\tSTEP\tLAST BEAT\tSTANDBY")
	for _, x := range ws.Workers {
		pid, standby := "-", "-"
		if x.PID > 0 {
			pid = fmt.Sprint(x.PID)
		}
		if x.Standby {
			standby = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s ago\t%s\n", x.ID, orDash(x.Host), pid, rankList(x.Ranks), x.Step,
			ago(time.Duration(x.BeatAgeMs*float64(time.Millisecond))), standby)
	}
	return tw.Flush()
}

// targetText prints a target worker count; 0 is every live worker.
func targetText(n int) string {
	if n == 0 {
		return "all"
	}
	return fmt.Sprint(n)
}

// workersText is a job's elastic workers as live/target ("2/all", "3/4"), "-" for a job with none
// and no target.
func workersText(st api.JobStatus) string {
	if st.LiveWorkers == 0 && st.Workers == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%s", st.LiveWorkers, targetText(st.Workers))
}

// rankList prints ranks with runs collapsed: 0-3,6,8-9; "-" for none.
func rankList(ranks []int) string {
	if len(ranks) == 0 {
		return "-"
	}
	rs := slices.Sorted(slices.Values(ranks))
	var b strings.Builder
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", rs[i], rs[j])
		} else {
			fmt.Fprint(&b, rs[i])
		}
		i = j + 1
	}
	return b.String()
}

// ago prints a duration to a tenth of a second.
func ago(d time.Duration) string { return max(0, d).Round(100 * time.Millisecond).String() }

func printRejects(w io.Writer, rj *api.Rejects) error {
	fmt.Fprintf(w, "job %s: %d rejected inputs\n", rj.Job, rj.Total)
	reasons := make([]string, 0, len(rj.Counts))
	for r := range rj.Counts {
		reasons = append(reasons, string(r))
	}
	sort.Strings(reasons)
	tw := newTable(w)
	fmt.Fprintln(tw, "REASON\tCOUNT")
	for _, r := range reasons {
		fmt.Fprintf(tw, "%s\t%d\n", r, rj.Counts[wire.Reason(r)])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rj.Recent) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "AT\tSOURCE\tREASON\tSHARD\tSTEP\tRANK\tDETAIL")
	for _, r := range rj.Recent {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.At.Local().Format(time.TimeOnly), r.Source, r.Reason,
			num(int64(r.Shard)), stepOrDash(r.Step), num(int64(r.Rank)), r.Detail)
	}
	return tw.Flush()
}

// num prints a shard or rank of a rejection, "-" when it is not known (-1).
func num(n int64) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// stepOrDash prints a rejection's step; steps start at 1, so 0 means not known.
func stepOrDash(step int64) string {
	if step <= 0 {
		return "-"
	}
	return fmt.Sprint(step)
}
