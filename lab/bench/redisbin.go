package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// The Redis baseline (redis.go) is built only with -tags redis, so that the fanin binary people run
// links no Redis client for a scenario only the bench runs; without the tag, e2e-redis is reported
// as skipped with ErrRedisNotBuilt, which says how to build it.

// ErrRedisNotBuilt is why e2e-redis is skipped by a binary built without -tags redis.
var ErrRedisNotBuilt = errors.New("the Redis baseline is not built into this binary: build it with -tags redis " +
	"(go run -tags redis ./cmd/fanin bench --only e2e-redis)")

// findRedis returns the redis-server binary to use, or an error saying why there is none: the
// baseline is not built in (ErrRedisNotBuilt), or there is no such binary.
func findRedis(cfg Config) (string, error) {
	if !RedisBuiltIn {
		return "", ErrRedisNotBuilt
	}
	if cfg.Redis != "" {
		if _, err := os.Stat(cfg.Redis); err != nil {
			return "", fmt.Errorf("redis-server %s: %w", cfg.Redis, err)
		}
		return cfg.Redis, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server is not in PATH (Debian: apt-get install redis-server)")
	}
	return p, nil
}
