// Package sdk is the Go client of fanin: workers publish gradients and receive parameters over NATS;
// operators create and delete jobs through the gateway's HTTP API.
package sdk
