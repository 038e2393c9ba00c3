package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway/api"
)

func poolCmd() *cobra.Command {
	var f apiFlags
	cmd := &cobra.Command{
		Use: "pool", Short: "Show the runtime pool: runtimes, their shards and load", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := f.admin().Pool(cmd.Context())
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printJSON(cmd.OutOrStdout(), p)
			}
			return printPool(cmd.OutOrStdout(), p, time.Now())
		},
	}
	f.register(cmd)
	return f.checked(cmd)
}

func printPool(w io.Writer, p *api.Pool, now time.Time) error {
	fmt.Fprintf(w, "%d runtimes, %d of %d shards placed\n", len(p.Runtimes), p.Placed, p.Shards)
	tw := newTable(w)
	fmt.Fprintln(tw, "RUNTIME\tCORES\tSHARDS\tPLACED\tBUSY\tNS/BYTE\tUP\tREPORTED")
	for _, r := range p.Runtimes {
		reported := "-"
		if r.Reported != nil {
			reported = now.Sub(*r.Reported).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f%%\t%.2f\t%s\t%s\n", r.ID, r.Cores, r.Shards, r.Placed, 100*r.Utilization,
			r.NanosPerByte, now.Sub(r.Started).Round(time.Second), reported)
	}
	return tw.Flush()
}
