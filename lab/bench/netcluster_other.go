//go:build !linux

package bench

import (
	"context"
	"fmt"
)

func runCluster(_ context.Context, rs *runState) ([]Result, error) {
	return []Result{{Scenario: "cluster", Case: fmt.Sprintf("N=%d,%dMbit", clusterWorkers, rs.cfg.linkMbit()), Metric: "steps/s", Skipped: netLabAvailable().Error()}}, nil
}
