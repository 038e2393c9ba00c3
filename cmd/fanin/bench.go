package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/internal/bench"
)

func benchCmd() *cobra.Command {
	var quick bool
	var only, out, redis string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the data plane against baselines measured in the same run (writes docs/BENCHMARKS.md)",
		Long: "Scenarios: " + strings.Join(bench.Scenarios(), ", ") + `.
Each reports fanin's figure, its baseline's on the same bytes, and the ratio. --out writes the
markdown report with the command that produced it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := bench.Config{Quick: quick, Redis: redis, Log: slog.Default()}
			if only != "" {
				cfg.Only = strings.Split(only, ",")
			}
			// A failed scenario is a row of the report: write it, then report the failure.
			results, runErr := bench.Run(cmd.Context(), cfg, cmd.ErrOrStderr())
			command := "go run ./cmd/fanin " + strings.Join(os.Args[1:], " ")
			md := bench.Markdown(results, command, bench.Environment(cfg))
			if out == "" {
				fmt.Fprint(cmd.OutOrStdout(), md)
			} else if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				return err
			}
			return runErr
		},
	}
	cmd.Flags().BoolVar(&quick, "quick", false, "small sizes and few iterations (under a minute)")
	cmd.Flags().StringVar(&only, "only", "", "comma-separated scenarios to run (default: all)")
	cmd.Flags().StringVar(&out, "out", "", "write the markdown report to this file (default: standard output)")
	cmd.Flags().StringVar(&redis, "redis", "", "redis-server binary for the Redis baseline (default: from PATH)")
	return cmd
}
