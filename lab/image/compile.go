package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Package is the import path of the fanin command, which the image runs.
const Package = "github.com/fanin-ml/fanin/cmd/fanin"

// Compile is one build of the fanin command for the image.
type Compile struct {
	Arch    string // GOARCH
	Version string // stamped into main.version, as `fanin --version` prints it
	Out     string // the binary's path
	Dir     string // where go build runs, inside fanin's module; "" for the current directory
	Package string // what to build; "" for Package (tests build smaller programs)
}

// Flags are go build's flags for the image's binary: no paths of the building machine
// (-trimpath), no VCS stamp (whatever GOFLAGS says: the revision is a label of the image), no
// symbol table and no build id, and the version stamped.
func Flags(version string) ([]string, error) {
	if version == "" || strings.ContainsAny(version, " \t\n'\"") {
		return nil, fmt.Errorf("version %q: want a non-empty word without quotes", version)
	}
	return []string{"-trimpath", "-buildvcs=false", "-ldflags", "-s -w -buildid= -X main.version=" + version}, nil
}

// Env is the environment of the image's go build: static (CGO_ENABLED=0), for linux/arch, at the
// baseline instruction set of the architecture whatever the building machine's environment says.
func Env(arch string) []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOAMD64=v1", "GOARM64=v8.0", "GOARM=7")
}

// Run runs go build. The same source and Go toolchain give the same binary, byte for byte.
func (c Compile) Run(ctx context.Context) error {
	flags, err := Flags(c.Version)
	if err != nil {
		return err
	}
	args := append([]string{"build"}, flags...)
	pkg := c.Package
	if pkg == "" {
		pkg = Package
	}
	args = append(args, "-o", c.Out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = c.Dir, Env(c.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for linux/%s: %w\n%s", c.Arch, err, out)
	}
	return nil
}
