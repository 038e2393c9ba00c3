// Adapted by fanin from Jaeger v1.76.0's cmd/jaeger/internal/extension/jaegerstorage/extension.go
// (Copyright (c) 2023 The Jaeger Authors, Apache-2.0): the same extension and lookup functions,
// starting in-memory storages only (see config.go).

package jaegerstorage

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/jaegertracing/jaeger/internal/metrics"
	"github.com/jaegertracing/jaeger/internal/storage/v1"
	"github.com/jaegertracing/jaeger/internal/storage/v2/api/tracestore"
	"github.com/jaegertracing/jaeger/internal/storage/v2/memory"
	"github.com/jaegertracing/jaeger/internal/telemetry"
)

type Extension interface {
	extension.Extension
	TraceStorageFactory(name string) (tracestore.Factory, bool)
	MetricStorageFactory(name string) (storage.MetricStoreFactory, bool)
}

type storageExt struct {
	config    *Config
	telset    component.TelemetrySettings
	factories map[string]tracestore.Factory
}

func newStorageExt(cfg *Config, telset component.TelemetrySettings) *storageExt {
	return &storageExt{config: cfg, telset: telset, factories: map[string]tracestore.Factory{}}
}

func (s *storageExt) Start(_ context.Context, host component.Host) error {
	telset := telemetry.FromOtelComponent(s.telset, host)
	for name, cfg := range s.config.TraceBackends {
		t := telset
		t.Metrics = telset.Metrics.Namespace(metrics.NSOptions{Name: "jaeger"}).Namespace(metrics.NSOptions{
			Name: "storage",
			Tags: map[string]string{"name": name, "kind": "memory", "role": "tracestore"},
		})
		f, err := memory.NewFactory(*cfg.Memory, t)
		if err != nil {
			return fmt.Errorf("failed to initialize storage '%s': %w", name, err)
		}
		s.factories[name] = f
	}
	return nil
}

func (*storageExt) Shutdown(context.Context) error { return nil }

func (s *storageExt) TraceStorageFactory(name string) (tracestore.Factory, bool) {
	f, ok := s.factories[name]
	return f, ok
}

func (*storageExt) MetricStorageFactory(string) (storage.MetricStoreFactory, bool) { return nil, false }

func findExtension(host component.Host) (Extension, error) {
	for id, ext := range host.GetExtensions() {
		if id.Type() == componentType {
			if e, ok := ext.(Extension); ok {
				return e, nil
			}
			return nil, fmt.Errorf("extension '%s' is not of expected type '%s'", id, componentType)
		}
	}
	return nil, fmt.Errorf("cannot find extension '%s' (make sure it's defined earlier in the config)", componentType)
}

func getStorageFactory(name string, host component.Host) (tracestore.Factory, error) {
	ext, err := findExtension(host)
	if err != nil {
		return nil, err
	}
	f, ok := ext.TraceStorageFactory(name)
	if !ok {
		return nil, fmt.Errorf("cannot find definition of storage '%s' in the configuration for extension '%s'", name, componentType)
	}
	return f, nil
}

func GetTraceStoreFactory(name string, host component.Host) (tracestore.Factory, error) {
	return getStorageFactory(name, host)
}

func GetMetricStorageFactory(name string, host component.Host) (storage.MetricStoreFactory, error) {
	if _, err := findExtension(host); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("cannot find metric storage '%s' declared by '%s' extension", name, componentType)
}

func GetSamplingStoreFactory(name string, host component.Host) (storage.SamplingStoreFactory, error) {
	f, err := getStorageFactory(name, host)
	if err != nil {
		return nil, err
	}
	ssf, ok := f.(storage.SamplingStoreFactory)
	if !ok {
		return nil, fmt.Errorf("storage '%s' does not support sampling store", name)
	}
	return ssf, nil
}

func GetPurger(name string, host component.Host) (storage.Purger, error) {
	f, err := getStorageFactory(name, host)
	if err != nil {
		return nil, err
	}
	p, ok := f.(storage.Purger)
	if !ok {
		return nil, fmt.Errorf("storage '%s' does not support purging", name)
	}
	return p, nil
}
