// Package gateway is fanin's HTTP API (/v1): jobs and their status, shards and placement, the
// runtime pool, the autoscaler policy and decisions, functions, rejected inputs, API tokens, quotas
// and per-job NATS credentials; see docs/API.md and openapi.json.
package gateway
