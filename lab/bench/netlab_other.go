//go:build !linux

package bench

import "errors"

// netLabAvailable: the cluster scenario's network namespaces and tc are Linux's.
func netLabAvailable() error {
	return errors.New("needs Linux: it emulates a cluster with network namespaces and tc")
}
