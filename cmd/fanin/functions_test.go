package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
)

// `fanin functions push|ls|rm` against a secured stack: push the Lion example, name it in a job,
// see rm refused while the job lives, then succeed.
func TestFunctionsCLI(t *testing.T) {
	t.Parallel()
	lion := wasmbuild.ForTest(t, "../../examples/functions/lion")
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: 1, Logger: testutil.Logger(), Auth: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	mod := filepath.Join(dir, "lion.wasm")
	if err := os.WriteFile(mod, lion, 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, st, functionsCmd, "push", mod, "--version", "3")
	if !strings.Contains(out, "uploaded: admin/lion@3") || !strings.Contains(out, `hyper beta1: 0.9, range "[0, 1)"`) {
		t.Fatalf("push:\n%s", out)
	}
	if out = mustCLI(t, st, functionsCmd, "push", mod, "--version", "3"); !strings.Contains(out, "already there: admin/lion@3") {
		t.Fatalf("push again:\n%s", out)
	}
	if out = mustCLI(t, st, functionsCmd, "ls"); !strings.Contains(out, "admin/lion@3") || !strings.Contains(out, "adam") {
		t.Fatalf("ls:\n%s", out)
	}
	spec := filepath.Join(dir, "lion.yaml")
	if err := os.WriteFile(spec, []byte("id: lion\ntensors: [{name: w, shape: [64]}]\nranks: 1\nfunction: {name: admin/lion@3, hyper: {lr: 0.01}}\nshard_size: 4KiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, st, jobsCmd, "create", "-f", spec)
	if _, err := cli(t, st, functionsCmd, "rm", "admin/lion@3"); err == nil || !strings.Contains(err.Error(), "function_in_use") {
		t.Fatalf("rm while in use: %v", err)
	}
	mustCLI(t, st, jobsCmd, "rm", "lion")
	testutil.CheckFor(t, 10e9, 20e6, func() error {
		_, err := cli(t, st, functionsCmd, "rm", "admin/lion@3")
		return err
	})
	if out = mustCLI(t, st, functionsCmd, "ls"); strings.Contains(out, "lion") {
		t.Fatalf("ls after rm:\n%s", out)
	}
}
