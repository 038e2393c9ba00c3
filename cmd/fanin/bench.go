package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func benchCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "bench",
		Short: "Measure the data plane against baselines (writes docs/BENCHMARKS.md)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("bench: not wired yet")
		},
	}
}
