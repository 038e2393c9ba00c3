package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/autoscaler"
)

func policyCmd() *cobra.Command {
	var f apiFlags
	cmd := &cobra.Command{Use: "policy", Short: "Show or replace the autoscaler policy; show its history"}
	f.register(cmd)
	get := &cobra.Command{
		Use: "get", Short: "Show the policy in force (YAML; -o json for JSON)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := f.admin().Policy(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), d)
			}
			rev := ""
			if d.Revision > 0 {
				rev = fmt.Sprintf(", revision %d of %s", d.Revision, d.Updated.Local().Format(time.DateTime))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# %s policy%s\n%s", d.Source, rev, d.YAML)
			return nil
		},
	}
	var file string
	set := &cobra.Command{
		Use: "set -f policy.yaml", Short: "Replace the policy (validated; absent knobs take their defaults; '-' reads stdin)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := readFileArg(cmd, file)
			if err != nil {
				return err
			}
			d, err := f.admin().SetPolicy(cmd.Context(), data)
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), d)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy stored as revision %d; the autoscaler follows it now\n", d.Revision)
			return nil
		},
	}
	set.Flags().StringVarP(&file, "file", "f", "", "policy file (YAML or JSON)")
	_ = set.MarkFlagRequired("file")
	history := &cobra.Command{
		Use: "history", Short: "List the stored revisions of the policy", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := f.admin().PolicyHistory(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), h)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "REVISION\tUPDATED\tMIN\tMAX\tTARGET\tNOTE")
			for _, r := range h {
				p, _ := r.Policy.(map[string]any)
				note := r.Error
				if r.Deleted {
					note = "deleted"
				}
				fmt.Fprintf(tw, "%d\t%s\t%v\t%v\t%v\t%s\n", r.Revision, r.Updated.Local().Format(time.DateTime),
					p["min_runtimes"], p["max_runtimes"], p["target_utilization"], note)
			}
			return tw.Flush()
		},
	}
	var limit int
	decisions := &cobra.Command{
		Use: "decisions", Short: "Show the autoscaler's latest decisions with their reasons", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ds, err := f.admin().Decisions(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), ds)
			}
			printDecisions(cmd.OutOrStdout(), ds)
			return nil
		},
	}
	decisions.Flags().IntVar(&limit, "limit", 10, "decisions to show")
	cmd.AddCommand(get, set, history, decisions)
	return f.checked(cmd)
}

func printDecisions(w io.Writer, ds []autoscaler.Decision) {
	for _, d := range ds {
		fmt.Fprintf(w, "%s  %-6s want %d runtimes (demand %.2f cores), %d moves, drain %v\n", d.At.Local().Format(time.TimeOnly),
			d.Mode, d.Desired, d.Demand, len(d.Moves), d.Drain)
		for _, r := range d.Reasons {
			fmt.Fprintf(w, "          %s\n", strings.TrimSpace(r))
		}
	}
}
