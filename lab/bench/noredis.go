//go:build !redis

package bench

import "context"

// RedisBuiltIn reports whether the Redis baseline (e2e-redis) is built into this binary: it is not
// (see redisbin.go).
const RedisBuiltIn = false

// startRedis is the Redis baseline's starter, which this binary does not have.
func startRedis(context.Context, *runState, workload, string) (*system, error) {
	return nil, ErrRedisNotBuilt
}
