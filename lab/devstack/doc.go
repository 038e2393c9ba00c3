// Package devstack runs all of fanin in one process on an embedded NATS server: the gateway, a pool
// of runtimes and the placer. `fanin dev` and the integration tests use it.
package devstack
