//go:build !unix

package bench

import "time"

func processCPU() time.Duration { return 0 }

func childCPU(int) time.Duration { return 0 }
