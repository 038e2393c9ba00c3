package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSDKLinksNoControlPlane keeps the worker SDK small: a program that trains with fanin (and the
// C library the Python package loads, built from it) must not link the autoscaler, the Kubernetes
// client or the servers. It fails naming the package that pulled such a dependency in.
func TestSDKLinksNoControlPlane(t *testing.T) {
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
