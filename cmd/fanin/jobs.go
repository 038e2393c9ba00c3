package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
)

func jobsCmd() *cobra.Command {
	var api, token, output string
	admin := func() *sdk.Admin { return sdk.NewAdmin(api, sdk.WithToken(token)) }
	cmd := &cobra.Command{Use: "jobs", Short: "Create, list, inspect and delete jobs through the gateway"}
	cmd.PersistentFlags().StringVar(&api, "api", envOr("FANIN_API", "http://127.0.0.1:8080"), "gateway URL (env FANIN_API)")
	cmd.PersistentFlags().StringVar(&token, "token", envOr("FANIN_TOKEN", ""), "API token (env FANIN_TOKEN)")
	cmd.PersistentFlags().StringVarP(&output, "output", "o", "table", "table or json")

	var file string
	create := &cobra.Command{
		Use:   "create -f spec.yaml",
		Short: "Create a job from a JSON or YAML spec ('-' reads standard input)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return err
			}
			rec, err := admin().CreateJobRaw(cmd.Context(), data)
			if err != nil {
				return err
			}
			return printJobs(cmd.OutOrStdout(), output, []job.Record{*rec})
		},
	}
	create.Flags().StringVarP(&file, "file", "f", "", "spec file")
	_ = create.MarkFlagRequired("file")

	ls := &cobra.Command{
		Use: "ls", Short: "List jobs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := admin().Jobs(cmd.Context())
			if err != nil {
				return err
			}
			return printJobs(cmd.OutOrStdout(), output, recs)
		},
	}
	get := &cobra.Command{
		Use: "get ID", Short: "Show one job with its layout", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rec, err := admin().Job(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return printJobs(cmd.OutOrStdout(), output, []job.Record{*rec})
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(rec)
		},
	}
	rm := &cobra.Command{
		Use: "rm ID...", Short: "Delete jobs, their streams and state", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := admin().DeleteJob(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "deleted", id)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

func printJobs(w io.Writer, output string, recs []job.Record) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	case "table":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tRANKS\tFUNCTION\tELEMENTS\tSHARDS\tSTORAGE\tCREATED")
		for _, r := range recs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", r.Spec.ID, r.Spec.Ranks, r.Spec.Function.Name,
				r.Layout.Elements, r.Layout.NumShards(), r.Spec.Storage, r.Created.Format("2006-01-02 15:04:05"))
		}
		return tw.Flush()
	default:
		return fmt.Errorf("-o %q: use table or json", output)
	}
}
