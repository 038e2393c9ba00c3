package main

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionLine is what `fanin version` and `fanin --version` print: the stamped version (or the
// module's, for a `go install`ed binary), the commit the binary was built from, as the Go
// toolchain records it when building inside a git work tree, and the Go version and platform.
func versionLine() string {
	info, _ := debug.ReadBuildInfo()
	return formatVersion(version, info)
}

// formatVersion is versionLine for a given build; info may be nil (no build information).
func formatVersion(stamped string, info *debug.BuildInfo) string {
	v, goVersion := stamped, goruntime.Version()
	commit, modified := "", false
	if info != nil {
		if v == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case commit == "":
		commit = "commit unknown"
	case modified:
		commit = "commit " + commit + ", modified"
	default:
		commit = "commit " + commit
	}
	return fmt.Sprintf("fanin %s (%s; %s %s/%s)", v, commit, goVersion, goruntime.GOOS, goruntime.GOARCH)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit it was built from, and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	}
}
