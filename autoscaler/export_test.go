package autoscaler

import "context"

// SetRegistryCheck replaces how c tells whether the runtime registry takes heartbeats.
func SetRegistryCheck(c *Controller, check func(context.Context) bool) { c.registryCheck = check }
