//go:build race

package runtime_test

func init() { raceEnabled = true }
