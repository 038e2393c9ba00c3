package main

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
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
	fmt.Fprintln(tw, "RUNTIME\tCORES\tSHARDS\tPLACED\tBUSY\tNS/BYTE\tNODE\tNIC\tIN/OUT MB/S\tUP\tREPORTED")
	for _, r := range p.Runtimes {
		reported := "-"
		if r.Reported != nil {
			reported = now.Sub(*r.Reported).Round(time.Second).String() + " ago"
		}
		node := cmp.Or(r.Node, "-")
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f%%\t%.2f\t%s\t%s\t%.1f/%.1f\t%s\t%s\n", r.ID, r.Cores, r.Shards, r.Placed, 100*r.Utilization,
			r.NanosPerByte, node, bandwidth(r.NICBytesPerSec), r.BytesInPerSec/1e6, r.BytesOutPerSec/1e6,
			now.Sub(r.Started).Round(time.Second), reported)
	}
	return tw.Flush()
}

// bandwidth writes a NIC's bytes per second as link speeds are written (100Mbit, 25Gbit); "-"
// when unknown.
func bandwidth(bytesPerSec float64) string {
	switch bits := bytesPerSec * 8; {
	case bits <= 0:
		return "-"
	case bits >= 1e9:
		return strconv.FormatFloat(bits/1e9, 'g', 4, 64) + "Gbit"
	default:
		return strconv.FormatFloat(bits/1e6, 'g', 4, 64) + "Mbit"
	}
}
