// Package wasmbuild compiles a Go aggregation function to a WebAssembly module with the standard
// toolchain, as docs/FUNCTIONS.md documents, for tests and benchmarks.
package wasmbuild

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Command is the documented build of a function module (run in the module's directory).
const Command = "GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o fn.wasm ."

// Build compiles the Go main package in dir to a module at out:
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o out.
func Build(ctx context.Context, dir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", dir, err, stderr.String())
	}
	return nil
}

var (
	mu    sync.Mutex
	built = map[string][]byte{} // by absolute directory, for the test process
)

// ForTest builds the module in dir once per test process and returns its bytes.
func ForTest(t testing.TB, dir string) []byte {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if b, ok := built[abs]; ok {
		return b
	}
	out, err := os.MkdirTemp("", "fanin-wasm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(out)
	file := filepath.Join(out, "fn.wasm")
	if err := Build(context.Background(), abs, file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	built[abs] = b
	return b
}
