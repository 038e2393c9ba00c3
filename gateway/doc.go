// Package gateway is fanin's HTTP API: jobs are created, listed and deleted here, and their specs
// persisted in JetStream.
package gateway
