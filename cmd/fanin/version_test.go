package main

import (
	"bytes"
	"context"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// execute runs cmd with args and ctx, and returns its output and error.
func execute(ctx context.Context, cmd *cobra.Command, args ...string) (string, error) {
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// fanin version and fanin --version print one line: version, commit, Go version.
func TestVersion(t *testing.T) {
	t.Parallel()
	out, err := execute(context.Background(), versionCmd())
	if err != nil || out != versionLine()+"\n" {
		t.Fatalf("fanin version: %q %v", out, err)
	}
	root, _ := rootCmd()
	out, err = execute(context.Background(), root, "--version")
	if err != nil || out != versionLine()+"\n" {
		t.Fatalf("fanin --version: %q %v", out, err)
	}
	info := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "27a4ba1758524032c338c662da8e31d77bc4e157"}, {Key: "vcs.modified", Value: "true"}}}
	if got := formatVersion("dev", info); !strings.HasPrefix(got, "fanin dev (commit 27a4ba1758524032c338c662da8e31d77bc4e157, modified; go1.26.1 ") {
		t.Errorf("formatVersion = %q", got)
	}
	info.Main.Version, info.Settings = "v0.2.0", nil // go install github.com/fanin-ml/fanin/cmd/fanin@v0.2.0
	if got := formatVersion("dev", info); !strings.HasPrefix(got, "fanin v0.2.0 (commit unknown; go1.26.1 ") {
		t.Errorf("formatVersion = %q", got)
	}
	if got := formatVersion("v0.3.0", nil); !strings.HasPrefix(got, "fanin v0.3.0 (commit unknown; go") {
		t.Errorf("formatVersion = %q", got)
	}
}
