// Command fanin-image builds fanin's container image without a Docker daemon: it compiles
// cmd/fanin as a static binary per platform, puts it in a one-layer image on nothing
// (lab/image), and writes an OCI layout or a tarball for `docker load`, or pushes it.
//
//	go run ./cmd/fanin-image --out bin/fanin-oci                  # linux/amd64 and linux/arm64
//	go run ./cmd/fanin-image --platform linux/amd64 --out bin/fanin.tar && docker load -i bin/fanin.tar
//	go run ./cmd/fanin-image --push registry.example.com/fanin    # prints registry.example.com/fanin@sha256:...
//
// A command of its own, not a subcommand of fanin: the image's binary then carries no registry
// client, and the image builder is not in the image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/fanin-ml/fanin/lab/image"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fanin-image:", err)
		os.Exit(2)
	}
}

// options are the command's flags.
type options struct {
	platforms []string // architectures
	out       string
	push      string
	binary    string
	tag       string
	meta      image.Meta
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("fanin-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	platform := fs.String("platform", "", "comma-separated linux/ARCH platforms (default linux/amd64,linux/arm64; for a .tar --out, this machine's)")
	out := fs.String("out", "", "write the image to this OCI layout directory, or, if it ends in .tar, to a tarball for `docker load` (one platform)")
	push := fs.String("push", "", "push the image (an index for several platforms) to REGISTRY/REPOSITORY[:TAG] with the credentials of ~/.docker/config.json, and print REGISTRY/REPOSITORY@sha256:...")
	binary := fs.String("binary", "", "put this static fanin binary in the image instead of compiling one (one platform)")
	version := fs.String("version", "", "the version stamped into fanin and labelled (default: git describe --tags --always --dirty, else dev)")
	revision := fs.String("revision", "", "the commit labelled (default: git rev-parse HEAD)")
	epoch := fs.String("source-date-epoch", "", "every file's mtime and the image's creation time, in seconds since 1970 (default: $SOURCE_DATE_EPOCH, else the commit's time, else 0)")
	tag := fs.String("tag", "", "the name a .tar --out is loaded as (default fanin:VERSION)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: fanin-image [--platform linux/amd64,...] [--out DIR|FILE.tar] [--push REF]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := options{out: *out, push: *push, binary: *binary, tag: *tag}
	if o.out == "" && o.push == "" {
		return o, errors.New("nothing to do: give --out, --push or both")
	}
	tarOut := strings.HasSuffix(o.out, ".tar")
	switch {
	case *platform != "":
		for _, p := range strings.Split(*platform, ",") {
			arch, ok := strings.CutPrefix(strings.TrimSpace(p), "linux/")
			if !ok || arch == "" {
				return o, fmt.Errorf("--platform %q: want linux/ARCH", p)
			}
			o.platforms = append(o.platforms, arch)
		}
	case tarOut || o.binary != "":
		o.platforms = []string{runtime.GOARCH}
	default:
		o.platforms = []string{"amd64", "arm64"}
	}
	if len(o.platforms) > 1 && (tarOut || o.binary != "") {
		return o, fmt.Errorf("a .tar --out and --binary take one platform, not %d", len(o.platforms))
	}

	o.meta.Version = firstOf(*version, git("describe", "--tags", "--always", "--dirty"), "dev")
	o.meta.Revision = firstOf(*revision, git("rev-parse", "HEAD"))
	sec := firstOf(*epoch, os.Getenv("SOURCE_DATE_EPOCH"), git("log", "-1", "--format=%ct"), "0")
	n, err := strconv.ParseInt(sec, 10, 64)
	if err != nil || n < 0 {
		return o, fmt.Errorf("source date epoch %q: want seconds since 1970", sec)
	}
	o.meta.Created = time.Unix(n, 0).UTC()
	if o.tag == "" {
		o.tag = image.Name + ":" + o.meta.Version
	}
	return o, nil
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// git runs git in the current directory and returns its output, or "" if it fails.
func git(args ...string) string {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// run builds the image as the flags say; stdout gets the digest reference (pushed) or the digest,
// stderr what it did.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	if err := checkOut(o.out); err != nil {
		return err
	}
	var bins []image.Binary
	if o.binary != "" {
		bins = []image.Binary{{Path: o.binary, Arch: o.platforms[0]}}
	} else {
		tmp, err := os.MkdirTemp("", "fanin-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		for _, arch := range o.platforms {
			start := time.Now()
			c := image.Compile{Arch: arch, Version: o.meta.Version, Out: filepath.Join(tmp, "fanin-"+arch)}
			if err := c.Run(ctx); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "compiled fanin %s for linux/%s in %v\n", o.meta.Version, arch, time.Since(start).Round(100*time.Millisecond))
			bins = append(bins, image.Binary{Path: c.Out, Arch: arch})
		}
	}

	// One platform is an image; several are an index of images.
	var (
		img v1.Image
		idx v1.ImageIndex
		d   v1.Hash
	)
	if len(bins) == 1 {
		img, err = image.Build(bins[0], o.meta)
		if err == nil {
			d, err = img.Digest()
		}
	} else {
		idx, err = image.BuildIndex(bins, o.meta)
		if err == nil {
			d, err = idx.Digest()
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "image %s: fanin %s for linux/%s, created %s\n", d, o.meta.Version, strings.Join(o.platforms, ", linux/"), o.meta.Created.Format(time.RFC3339))

	if o.out != "" {
		if err := write(o, img, idx); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", o.out)
	}
	if o.push == "" {
		fmt.Fprintln(stdout, d)
		return nil
	}
	ref, err := name.ParseReference(o.push)
	if err != nil {
		return fmt.Errorf("--push: %w", err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithUserAgent("fanin-image")}
	if img != nil {
		err = remote.Write(ref, img, opts...)
	} else {
		err = remote.WriteIndex(ref, idx, opts...)
	}
	if err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	pushed := ref.Context().Digest(d.String())
	fmt.Fprintf(stderr, "pushed %s; for kubectl apply -k deploy/kubernetes, set in its kustomization.yaml:\n"+
		"images:\n  - name: %s\n    newName: %s\n    digest: %s\n", ref, image.Name, ref.Context().Name(), d)
	fmt.Fprintln(stdout, pushed)
	return nil
}

// checkOut refuses to replace a directory that is not an OCI layout (before the build, which takes
// minutes).
func checkOut(out string) error {
	if out == "" || strings.HasSuffix(out, ".tar") {
		return nil
	}
	if _, err := os.Stat(out); err == nil {
		if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
			return fmt.Errorf("--out %s exists and is not an OCI layout: not replacing it", out)
		}
	}
	return nil
}

// write writes the image or index to o.out: a tarball for docker load if it ends in .tar, else an
// OCI layout directory, replaced if it is one already.
func write(o options, img v1.Image, idx v1.ImageIndex) error {
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if strings.HasSuffix(o.out, ".tar") {
		tag, err := name.NewTag(o.tag)
		if err != nil {
			return fmt.Errorf("--tag: %w", err)
		}
		return tarball.WriteToFile(o.out, tag, img)
	}
	if err := checkOut(o.out); err != nil {
		return err
	}
	if err := os.RemoveAll(o.out); err != nil {
		return err
	}
	p, err := layout.Write(o.out, empty.Index)
	if err != nil {
		return err
	}
	ann := layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.meta.Version})
	if img != nil {
		return p.AppendImage(img, ann)
	}
	return p.AppendIndex(idx, ann)
}
