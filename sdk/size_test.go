package sdk_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// maxWorkerBytes bounds the size of the smallest worker, unstripped, as go build makes it.
const maxWorkerBytes = 12_000_000

// TestMinimalWorkerSize builds the smallest worker (examples/minimal-worker: Connect, Worker,
// Params, Step) and, as the baseline, a program doing the same with nats.go alone
// (testdata/natsonly), each unstripped and stripped (-ldflags=-s -w), and fails when the worker is
// over maxWorkerBytes unstripped. What it logs is the "Binary sizes" table of docs/BENCHMARKS.md:
//
//	go test -run TestMinimalWorkerSize -v ./sdk
func TestMinimalWorkerSize(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds four programs")
	}
	dir := t.TempDir()
	size := func(pkg string, stripped bool) int64 {
		t.Helper()
		out := filepath.Join(dir, filepath.Base(pkg))
		args := []string{"build", "-o", out}
		if stripped {
			out += "-stripped"
			args = []string{"build", "-ldflags=-s -w", "-o", out}
		}
		cmd := exec.Command("go", append(args, pkg)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, b)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	const worker, baseline = "github.com/fanin-ml/fanin/examples/minimal-worker", "./testdata/natsonly"
	w, ws := size(worker, false), size(worker, true)
	n, ns := size(baseline, false), size(baseline, true)
	cgo, _ := exec.Command("go", "env", "CGO_ENABLED").Output()
	mb := func(b int64) float64 { return float64(b) / 1e6 }
	t.Logf("%s %s/%s, CGO_ENABLED=%s; MB = 10^6 bytes\n"+
		"| program | go build | go build -ldflags=-s -w |\n|---|---:|---:|\n"+
		"| nats.go alone (sdk/testdata/natsonly) | %.1f MB | %.1f MB |\n"+
		"| minimal worker (examples/minimal-worker) | %.1f MB | %.1f MB |\n"+
		"| difference | +%.1f MB | +%.1f MB |",
		runtime.Version(), runtime.GOOS, runtime.GOARCH, strings.TrimSpace(string(cgo)),
		mb(n), mb(ns), mb(w), mb(ws), mb(w-n), mb(ws-ns))
	if w > maxWorkerBytes {
		t.Errorf("the minimal worker is %d bytes, over %d (nats.go alone: %d): see what it links with "+
			"go version -m, and TestSDKLinksNoControlPlane", w, maxWorkerBytes, n)
	}
}
