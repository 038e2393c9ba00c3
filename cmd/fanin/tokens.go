package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
)

func tokensCmd() *cobra.Command {
	var f apiFlags
	cmd := &cobra.Command{Use: "tokens", Short: "Manage team tokens: they create jobs within a quota (admin)"}
	f.register(cmd)
	var q api.Quota
	var bps string
	create := &cobra.Command{
		Use: "create NAME", Short: "Issue a team token (shown once)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if bps != "" {
				n, err := job.ParseByteSize(bps)
				if err != nil {
					return fmt.Errorf("--bytes-per-second: %w", err)
				}
				q.BytesPerSecond = int64(n)
			}
			t, err := f.admin().CreateTeam(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "team token %s (%s), shown once:\n  %s\n", t.ID, t.Name, t.Token)
			return nil
		},
	}
	create.Flags().IntVar(&q.Jobs, "jobs", 0, "live jobs the token may own (0: no limit)")
	create.Flags().IntVar(&q.Shards, "shards", 0, "shards per job (0: no limit)")
	create.Flags().StringVar(&bps, "bytes-per-second", "", "gradient bytes each job may have aggregated per second, e.g. 50MiB (default: no limit)")
	ls := &cobra.Command{
		Use: "ls", Short: "List team tokens", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := f.admin().Teams(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), ts)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ID\tNAME\tTOKEN\tJOBS\tMAX_JOBS\tMAX_SHARDS\tBYTES/S\tCREATED")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", t.ID, t.Name, t.Hint, t.Jobs, t.Quota.Jobs, t.Quota.Shards,
					human(float64(t.Quota.BytesPerSecond)), t.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm ID...", Short: "Revoke team tokens (their jobs stay)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := f.admin().DeleteTeam(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "revoked", id)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return f.checked(cmd)
}
