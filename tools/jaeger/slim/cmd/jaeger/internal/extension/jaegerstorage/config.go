// Adapted by fanin from Jaeger v1.76.0's cmd/jaeger/internal/extension/jaegerstorage/config.go
// (Copyright (c) 2023 The Jaeger Authors, Apache-2.0): the in-memory trace storage only. Jaeger's
// configuration names Badger, Cassandra, Elasticsearch, OpenSearch, ClickHouse, gRPC and
// Prometheus backends, whose clients make up most of its build; a configuration naming one of them
// is refused here with a clear error.

package jaegerstorage

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/collector/confmap"

	"github.com/jaegertracing/jaeger/internal/storage/v1/memory"
)

// Config names trace storages; this build has only the in-memory one.
type Config struct {
	TraceBackends  map[string]TraceBackend  `mapstructure:"backends"`
	MetricBackends map[string]MetricBackend `mapstructure:"metric_backends"`
}

// TraceBackend is one named storage.
type TraceBackend struct {
	Memory *memory.Configuration `mapstructure:"memory"`
}

// MetricBackend: no metric storage is built in.
type MetricBackend struct{}

func (cfg *TraceBackend) Unmarshal(conf *confmap.Conf) error {
	if conf.IsSet("memory") {
		cfg.Memory = &memory.Configuration{MaxTraces: 1_000_000}
	}
	if err := conf.Unmarshal(cfg); err != nil {
		return fmt.Errorf("%w (this Jaeger, built by fanin's scripts/jaeger.sh, stores traces in memory only)", err)
	}
	return nil
}

func (cfg *Config) Validate() error {
	if len(cfg.TraceBackends) == 0 {
		return errors.New("at least one storage is required")
	}
	for name, b := range cfg.TraceBackends {
		if b.Memory == nil {
			return fmt.Errorf("storage '%s': this Jaeger is built with the memory backend only", name)
		}
	}
	if len(cfg.MetricBackends) > 0 {
		return errors.New("this Jaeger is built without metric storage backends")
	}
	return nil
}
