package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/fanin-ml/fanin/lab/image"
)

// static compiles an empty program for linux/GOARCH as fanin-image compiles fanin: a static binary
// to put in images quickly (lab/image's tests put fanin itself in one and run it).
func static(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("images hold Linux binaries")
	}
	dir := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module tiny\n\ngo 1.26\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "tiny")
	if err := (image.Compile{Arch: runtime.GOARCH, Version: "v1", Out: out, Dir: dir, Package: "."}).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	return out
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	t.Logf("fanin-image %s:\n%s", strings.Join(args, " "), stderr.String())
	return strings.TrimSpace(stdout.String()), err
}

// TestWriteAndPush writes the image as an OCI layout and as a docker tarball and pushes it to a
// registry (go-containerregistry's, in memory): all three hold the image of the printed digest.
func TestWriteAndPush(t *testing.T) {
	t.Parallel()
	bin := static(t)
	dir := t.TempDir()
	common := []string{"--binary", bin, "--version", "v9.9.9", "--revision", "abc", "--source-date-epoch", "1700000000"}

	ociDir := filepath.Join(dir, "oci")
	digest, err := runCLI(t, append(common, "--out", ociDir)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("printed %q, want the digest", digest)
	}
	idx, err := layout.ImageIndexFromPath(ociDir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != digest || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v9.9.9" {
		t.Fatalf("OCI layout index %+v, want the one image %s named v9.9.9", im.Manifests, digest)
	}
	// Again over the same layout: replaced, the same digest.
	if again, err := runCLI(t, append(common, "--out", ociDir)...); err != nil || again != digest {
		t.Fatalf("second build: %q, %v; want %s", again, err, digest)
	}

	tarPath := filepath.Join(dir, "fanin.tar")
	if _, err := runCLI(t, append(common, "--out", tarPath)...); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(tarPath, mustTag(t, "fanin:v9.9.9"))
	if err != nil {
		t.Fatalf("the tarball has no image tagged fanin:v9.9.9: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Labels[image.LabelRevision] != "abc" || cf.Created.Unix() != 1700000000 {
		t.Fatalf("tarball's config: user %q, labels %v, created %v", cf.Config.User, cf.Config.Labels, cf.Created)
	}

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	repo := strings.TrimPrefix(reg.URL, "http://") + "/fanin"
	pushed, err := runCLI(t, append(common, "--push", repo+":v9.9.9")...)
	if err != nil {
		t.Fatal(err)
	}
	if want := repo + "@" + digest; pushed != want {
		t.Fatalf("printed %q, want %q", pushed, want)
	}
	for _, ref := range []string{pushed, repo + ":v9.9.9"} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(r)
		if err != nil {
			t.Fatalf("get %s from the registry: %v", ref, err)
		}
		if desc.Digest.String() != digest {
			t.Fatalf("%s has digest %s, want %s", ref, desc.Digest, digest)
		}
	}
}

func mustTag(t *testing.T, s string) *name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return &tag
}

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "nothing to do"},
		{[]string{"--out", "x.tar", "--platform", "linux/amd64,linux/arm64"}, "one platform"},
		{[]string{"--push", "r/f", "--binary", "b", "--platform", "linux/amd64,linux/arm64"}, "one platform"},
		{[]string{"--out", "d", "--platform", "darwin/arm64"}, "want linux/ARCH"},
		{[]string{"--out", "d", "--source-date-epoch", "yesterday"}, "seconds since 1970"},
		{[]string{"--out", "d", "extra"}, "unexpected arguments"},
	} {
		_, err := parse(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	o, err := parse([]string{"--push", "r/f", "--version", "v1", "--source-date-epoch", "5"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.platforms, ",") != "amd64,arm64" || o.meta.Created.Unix() != 5 || o.tag != "fanin:v1" {
		t.Errorf("defaults: platforms %v, created %v, tag %s", o.platforms, o.meta.Created, o.tag)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "7")
	if o, err := parse([]string{"--out", "x.tar"}, &bytes.Buffer{}); err != nil || o.meta.Created.Unix() != 7 || strings.Join(o.platforms, ",") != runtime.GOARCH {
		t.Errorf("SOURCE_DATE_EPOCH=7 --out x.tar: created %v, platforms %v, err %v", o.meta.Created, o.platforms, err)
	}
	// An existing directory that is not an OCI layout is not replaced.
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	if err := os.WriteFile(keep, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "--binary", static(t), "--out", dir, "--version", "v1"); err == nil || !strings.Contains(err.Error(), "not an OCI layout") {
		t.Errorf("--out over a directory that is not an OCI layout: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("the directory's file: %v", err)
	}
}
