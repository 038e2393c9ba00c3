//go:build !linux

package bench

import (
	"context"
	"fmt"
)

func runCluster(context.Context, *runState) ([]Result, error) {
	return []Result{{Scenario: "cluster", Case: fmt.Sprintf("N=%d,%dMbit", clusterWorkers, clusterMbit), Metric: "steps/s", Skipped: netLabAvailable().Error()}}, nil
}
