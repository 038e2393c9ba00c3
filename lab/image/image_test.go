package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/fanin-ml/fanin/lab/image"
)

// binDir holds the binaries built once for the whole test run.
var binDir string

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fanin-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const testVersion = "v0.0.0-imagetest"

var (
	faninOnce sync.Once
	faninPath string
	faninErr  error
)

// faninBinary compiles cmd/fanin for this machine's architecture as the image builder does, once
// per test run.
func faninBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("compiles cmd/fanin: runs without -short")
	}
	if raceEnabled {
		t.Skip("gzips fanin's 75 MB several times, 10 times slower under the race detector, and has no concurrency to check: runs without -race")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image's binary is a Linux one")
	}
	faninOnce.Do(func() {
		start := time.Now()
		faninPath = filepath.Join(binDir, "fanin-"+runtime.GOARCH)
		faninErr = image.Compile{Arch: runtime.GOARCH, Version: testVersion, Out: faninPath}.Run(context.Background())
		t.Logf("compiled cmd/fanin in %v", time.Since(start).Round(time.Millisecond))
	})
	if faninErr != nil {
		t.Fatal(faninErr)
	}
	return faninPath
}

// tinyBinary compiles an empty Go program for linux/arch as the image builder compiles fanin: a
// static binary of any architecture at a fraction of fanin's build time.
func tinyBinary(t *testing.T, arch string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module tiny\n\ngo 1.26\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "tiny")
	if err := (image.Compile{Arch: arch, Version: testVersion, Out: out, Dir: dir, Package: "."}).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	builtOnce sync.Once
	built     v1.Image
	builtErr  error
)

// faninImage is the image of faninBinary with meta, built once per test run.
func faninImage(t *testing.T) v1.Image {
	t.Helper()
	bin := faninBinary(t)
	builtOnce.Do(func() { built, builtErr = image.Build(image.Binary{Path: bin, Arch: runtime.GOARCH}, meta) })
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return built
}

var meta = image.Meta{Created: time.Unix(1700000000, 0), Version: testVersion, Revision: "0123456789abcdef0123456789abcdef01234567"}

func digest(t *testing.T, img interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestBuildReproducible builds the image of one binary twice, the second time from a copy of it
// with another path, mode and mtime: the digests are equal.
func TestBuildReproducible(t *testing.T) {
	t.Parallel()
	bin := faninBinary(t)
	build := func(path string, m image.Meta) v1.Hash {
		img, err := image.Build(image.Binary{Path: path, Arch: runtime.GOARCH}, m)
		if err != nil {
			t.Fatal(err)
		}
		return digest(t, img)
	}
	first := digest(t, faninImage(t))
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(other, data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(other, time.Unix(1, 0), time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	if second := build(other, meta); second != first {
		t.Fatalf("two builds of the same bytes (at another path, mode and mtime the second time): %s and %s", first, second)
	}
	t.Logf("image digest (twice): %s", first)
}

// layerEntry is a tar header of the layer and the file's bytes.
type layerEntry struct {
	h    *tar.Header
	data []byte
}

func layerEntries(t *testing.T, img v1.Image) []layerEntry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var es []layerEntry
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return es
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, layerEntry{h, data})
	}
}

// TestImageContents checks the layer file by file (names in order, types, modes, owners, mtimes,
// the users) and the config (entrypoint, user, platform, labels, created).
func TestImageContents(t *testing.T) {
	t.Parallel()
	img := faninImage(t)
	binData, err := os.ReadFile(faninBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name     string
		typ      byte
		mode     int64
		uid, gid int
	}{
		{"etc/", tar.TypeDir, 0o755, 0, 0},
		{"etc/group", tar.TypeReg, 0o644, 0, 0},
		{"etc/passwd", tar.TypeReg, 0o644, 0, 0},
		{"fanin", tar.TypeReg, 0o755, 0, 0},
		{"home/", tar.TypeDir, 0o755, 0, 0},
		{"home/nonroot/", tar.TypeDir, 0o700, 65532, 65532},
		{"tmp/", tar.TypeDir, 0o1777, 0, 0},
	}
	es := layerEntries(t, img)
	if len(es) != len(want) {
		var names []string
		for _, e := range es {
			names = append(names, e.h.Name)
		}
		t.Fatalf("layer holds %v, want %d entries", names, len(want))
	}
	for i, w := range want {
		h := es[i].h
		if h.Name != w.name || h.Typeflag != w.typ || h.Mode != w.mode || h.Uid != w.uid || h.Gid != w.gid {
			t.Errorf("entry %d: %s type %c mode %o owner %d:%d, want %s type %c mode %o owner %d:%d",
				i, h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, w.name, w.typ, w.mode, w.uid, w.gid)
		}
		if !h.ModTime.Equal(meta.Created) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, meta.Created)
		}
		if h.Linkname != "" || len(h.PAXRecords) != 0 || h.Format != tar.FormatUSTAR {
			t.Errorf("%s: link %q, PAX records %v, format %v; want plain USTAR", h.Name, h.Linkname, h.PAXRecords, h.Format)
		}
	}
	if !bytes.Equal(es[3].data, binData) {
		t.Error("/fanin in the layer differs from the binary")
	}
	if p := string(es[2].data); !strings.Contains(p, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:") {
		t.Errorf("/etc/passwd has no nonroot user 65532 with home /home/nonroot:\n%s", p)
	}
	if g := string(es[1].data); !strings.Contains(g, "\nnonroot:x:65532:") {
		t.Errorf("/etc/group has no group nonroot 65532:\n%s", g)
	}

	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("media types %s, config %s; want OCI", m.MediaType, m.Config.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/fanin" || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/fanin] and none", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.User)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if !cf.Created.Time.Equal(meta.Created) {
		t.Errorf("created %v, want %v", cf.Created, meta.Created)
	}
	for k, v := range map[string]string{
		image.LabelSource:   "https://github.com/fanin-ml/fanin",
		image.LabelVersion:  meta.Version,
		image.LabelRevision: meta.Revision,
		image.LabelCreated:  "2023-11-14T22:13:20Z",
	} {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(meta.Created) {
		t.Errorf("history %+v", cf.History)
	}
}

// TestBinaryRuns takes /fanin out of the layer and runs it: it starts on this machine with
// nothing around it but the kernel, and prints the version stamped at build time.
func TestBinaryRuns(t *testing.T) {
	t.Parallel()
	var fanin layerEntry
	for _, e := range layerEntries(t, faninImage(t)) {
		if e.h.Name == "fanin" {
			fanin = e
		}
	}
	extracted := filepath.Join(t.TempDir(), "fanin")
	if err := os.WriteFile(extracted, fanin.data, os.FileMode(fanin.h.Mode)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(extracted, "--version")
	cmd.Env = []string{} // nothing from this machine's environment
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("/fanin --version: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "fanin "+testVersion+" ("; !strings.HasPrefix(got, want) {
		t.Fatalf("/fanin --version printed %q, want it to start with %q", got, want)
	}
}

// TestBuildRefuses: a dynamically linked binary and a binary of another architecture.
func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	for _, sh := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(sh); err != nil {
			continue
		}
		_, err := image.Build(image.Binary{Path: sh, Arch: runtime.GOARCH}, meta)
		if !errors.Is(err, image.ErrNotStatic) {
			t.Errorf("Build(%s): %v, want ErrNotStatic", sh, err)
		}
	}
	if testing.Short() {
		return
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if other == "" {
		t.Skip("no other architecture to compare with")
	}
	tiny := tinyBinary(t, other)
	if _, err := image.Build(image.Binary{Path: tiny, Arch: runtime.GOARCH}, meta); err == nil || !strings.Contains(err.Error(), "not "+runtime.GOARCH) {
		t.Errorf("Build of a %s binary as %s: %v", other, runtime.GOARCH, err)
	}
}

// TestBuildIndex: an index of linux/amd64 and linux/arm64 images, each manifest with its platform
// and its image's config agreeing; built twice, the same digest.
func TestBuildIndex(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("compiles for two architectures")
	}
	bins := []image.Binary{{Path: tinyBinary(t, "arm64"), Arch: "arm64"}, {Path: tinyBinary(t, "amd64"), Arch: "amd64"}}
	idx, err := image.BuildIndex(bins, meta)
	if err != nil {
		t.Fatal(err)
	}
	again, err := image.BuildIndex([]image.Binary{bins[1], bins[0]}, meta)
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := digest(t, idx), digest(t, again); d1 != d2 {
		t.Fatalf("two builds of the index: %s and %s", d1, d2)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 2 {
		t.Fatalf("index %s with %d manifests", im.MediaType, len(im.Manifests))
	}
	for i, arch := range []string{"amd64", "arm64"} {
		d := im.Manifests[i]
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != arch || d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: %s platform %+v, want linux/%s", i, d.MediaType, d.Platform, arch)
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != arch {
			t.Errorf("manifest %d (%s) has a config for %s", i, arch, cf.Architecture)
		}
	}
	if _, err := image.BuildIndex([]image.Binary{bins[0], bins[0]}, meta); err == nil {
		t.Error("two binaries of one architecture: no error")
	}
}

func TestFlagsRefuseOddVersions(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "v1 2", "v1'", `v"1`} {
		if _, err := image.Flags(v); err == nil {
			t.Errorf("Flags(%q): no error", v)
		}
	}
}
