// Adapted by fanin from Jaeger v1.76.0's cmd/jaeger/internal/components.go (Copyright (c) 2023 The
// Jaeger Authors, Apache-2.0): only the components of the pipeline fanin's tests and docs run
// (all-in-one.yaml beside this file): OTLP in, batched, into Jaeger's in-memory storage, read by
// Jaeger's query service. Jaeger's own list links about 50 receivers, exporters, processors and
// extensions (Kafka, Elasticsearch, Cassandra, ClickHouse, cloud authentication...).

package internal

import (
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"

	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/exporters/storageexporter"
	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/extension/jaegerquery"
	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/extension/jaegerstorage"
)

// Components are the factories of this build's components.
func Components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](jaegerquery.NewFactory(), jaegerstorage.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](storageexporter.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	return f, nil
}
