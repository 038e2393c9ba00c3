// Package testutil holds helpers shared by fanin's tests: polling for a condition, a quiet logger,
// a running in-process fanin, and deterministic gradients.
package testutil
