package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSDKLinksNoControlPlane keeps the worker SDK small: a program that trains with fanin (and the
// C library the Python package loads, built from it) must not link the autoscaler, the Kubernetes
// client or the servers, nor what only some programs want and others set up themselves: an
// OpenTelemetry SDK and its exporters (and gRPC, protobuf under them), a YAML parser, a Prometheus
// client. It fails naming the package that pulled such a dependency in.
func TestSDKLinksNoControlPlane(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/fanin-ml/fanin/sdk").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"k8s.io/",
		"github.com/fanin-ml/fanin/autoscaler",
		"github.com/fanin-ml/fanin/gateway", // gateway/api is allowed (below)
		"github.com/fanin-ml/fanin/runtime",
		"github.com/fanin-ml/fanin/dashboard",
		"github.com/nats-io/nats-server",
		// Tracing: the OpenTelemetry API only (sdk.WithTracerProvider); package otlp sets up
		// fanin's exporting provider, the program its own.
		"github.com/fanin-ml/fanin/internal/telemetry/otlp",
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters/",
		"go.opentelemetry.io/proto/",
		"google.golang.org/grpc",
		"google.golang.org/protobuf",
		"github.com/grpc-ecosystem/",
		// YAML: job specs in YAML are the gateway's and the CLI's (job/jobyaml).
		"github.com/fanin-ml/fanin/job/jobyaml",
		"sigs.k8s.io/yaml",
		"go.yaml.in/",
		"gopkg.in/yaml",
		// Metrics: behind sdk.Meter; sdk/prom is the Prometheus one, imported on purpose.
		"github.com/fanin-ml/fanin/sdk/prom",
		"github.com/fanin-ml/fanin/internal/metrics",
		"github.com/prometheus/",
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		if dep == "github.com/fanin-ml/fanin/gateway/api" {
			continue
		}
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the sdk links %s; find who imports it with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./sdk | grep %s", dep, dep)
			}
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list listed %d packages: %q", len(deps), deps)
	}
}
