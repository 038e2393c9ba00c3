//go:build race

package image_test

func init() { raceEnabled = true }
