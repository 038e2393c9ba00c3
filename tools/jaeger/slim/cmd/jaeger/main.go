// Adapted by fanin from Jaeger v1.76.0's cmd/jaeger/main.go (Copyright (c) 2023 The Jaeger
// Authors, Apache-2.0): the collector command alone, without the docs, version and Elasticsearch
// mappings subcommands, whose imports link the Elasticsearch client.

package main

import (
	"log"

	"github.com/jaegertracing/jaeger/cmd/jaeger/internal"
)

func main() {
	if err := internal.Command().Execute(); err != nil {
		log.Fatal(err)
	}
}
