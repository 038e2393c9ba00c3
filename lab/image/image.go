package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// Name is the image name every fanin container of deploy/kubernetes gives; the kustomization's
	// images: entry of that name says where the image was pushed.
	Name = "fanin"
	// Entrypoint is the binary's path in the image.
	Entrypoint = "/fanin"
	// UID and GID are the user the image runs as: nonroot, as in the distroless images.
	UID, GID = 65532, 65532
	// Source is the repository the image's labels name.
	Source = "https://github.com/fanin-ml/fanin"
)

// The image's OCI labels (the image-spec's annotation keys, which are also used as labels).
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelRevision = "org.opencontainers.image.revision"
	LabelVersion  = "org.opencontainers.image.version"
	LabelCreated  = "org.opencontainers.image.created"
	LabelTitle    = "org.opencontainers.image.title"
)

// ErrNotStatic is returned for a binary that needs a dynamic loader or shared libraries, which the
// image does not have.
var ErrNotStatic = errors.New("not a static executable")

// Meta is what the image says about itself besides its files.
type Meta struct {
	// Created is every file's modification time and the image's creation time, to the second. The
	// zero Time stands for the Unix epoch.
	Created  time.Time
	Version  string // the org.opencontainers.image.version label, if not empty
	Revision string // the org.opencontainers.image.revision label (the commit), if not empty
}

func (m Meta) created() time.Time {
	if m.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return m.Created.UTC().Truncate(time.Second)
}

// Binary is a static Linux executable of fanin for one architecture.
type Binary struct {
	Path string
	Arch string // as GOARCH: amd64, arm64, ...
}

// elfMachines are the architectures an image can be built for, with their ELF machine.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"ppc64le": elf.EM_PPC64,
	"riscv64": elf.EM_RISCV,
	"s390x":   elf.EM_S390,
}

// checkStatic returns an error unless path is an ELF executable for arch that needs no loader and
// no shared library: the image holds nothing else, so any other binary would fail to start there,
// and only once a kubelet runs it.
func checkStatic(path, arch string) error {
	want, ok := elfMachines[arch]
	if !ok {
		return fmt.Errorf("architecture %q: want one of amd64, arm64, arm, ppc64le, riscv64, s390x", arch)
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("%s is for %v, not %s", path, f.Machine, arch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s: ELF type %v: %w", path, f.Type, ErrNotStatic)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s asks for a dynamic loader (build it with CGO_ENABLED=0): %w", path, ErrNotStatic)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs %v: %w", path, libs, ErrNotStatic)
	}
	return nil
}

// File is one entry of the image's layer.
type File struct {
	Name     string // the path in the layer, without a leading slash; a directory's ends in "/"
	Mode     int64  // permission bits, with the sticky bit (01000) for /tmp
	UID, GID int
	Dir      bool
	Data     []byte
}

// passwd and group name root, nobody and nonroot, as the distroless images do.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

// Files lists the layer's entries, sorted by name: the binary at /fanin (root-owned, 0755), the
// users in /etc/passwd and /etc/group, the nonroot user's home (`fanin dev` keeps its data under
// $HOME/.cache, and the runtime sets HOME from /etc/passwd), and /tmp with mode 1777. Nothing else:
// no shell, no libc, no CA certificates (mount a bundle and set SSL_CERT_FILE for TLS to servers
// signed by a public CA).
func Files(binary []byte) []File {
	fs := []File{
		{Name: "etc/", Mode: 0o755, Dir: true},
		{Name: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Name: strings.TrimPrefix(Entrypoint, "/"), Mode: 0o755, Data: binary},
		{Name: "home/", Mode: 0o755, Dir: true},
		{Name: "home/nonroot/", Mode: 0o700, UID: UID, GID: GID, Dir: true},
		{Name: "tmp/", Mode: 0o1777, Dir: true},
	}
	slices.SortFunc(fs, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return fs
}

// layerTar writes files as a tar archive whose bytes depend on nothing but files and mtime.
func layerTar(files []File, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name: f.Name, Mode: f.Mode, Uid: f.UID, Gid: f.GID,
			Uname: userName(f.UID), Gname: userName(f.GID),
			ModTime: mtime, Format: tar.FormatUSTAR,
		}
		if f.Dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func userName(id int) string {
	switch id {
	case 0:
		return "root"
	case UID:
		return "nonroot"
	}
	return strconv.Itoa(id)
}

// Build makes the image of one platform: the layer of Files with every entry's mtime meta.Created,
// gzip-compressed, OCI media types, and a config that runs /fanin as 65532:65532 with the OCI
// labels. The same binary and meta give the same digest (with the same Go version: the layer's gzip
// stream is compress/gzip's).
func Build(bin Binary, meta Meta) (v1.Image, error) {
	if err := checkStatic(bin.Path, bin.Arch); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin.Path)
	if err != nil {
		return nil, err
	}
	created := meta.created()
	tarBytes, err := layerTar(Files(data), created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "fanin-image",
			Comment:   "/fanin, /etc/passwd, /etc/group, /home/nonroot, /tmp",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", bin.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Labels:     labels(meta, created),
	}
	return mutate.ConfigFile(img, cf)
}

func labels(meta Meta, created time.Time) map[string]string {
	l := map[string]string{
		LabelSource:  Source,
		LabelTitle:   "fanin",
		LabelCreated: created.Format(time.RFC3339),
	}
	if meta.Version != "" {
		l[LabelVersion] = meta.Version
	}
	if meta.Revision != "" {
		l[LabelRevision] = meta.Revision
	}
	return l
}

// BuildIndex makes one image per binary and an OCI image index of them, each manifest with its
// platform, in the order of the architectures' names.
func BuildIndex(bins []Binary, meta Meta) (v1.ImageIndex, error) {
	bins = slices.Clone(bins)
	slices.SortFunc(bins, func(a, b Binary) int { return strings.Compare(a.Arch, b.Arch) })
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for i, b := range bins {
		if i > 0 && bins[i-1].Arch == b.Arch {
			return nil, fmt.Errorf("two binaries for %s", b.Arch)
		}
		img, err := Build(b, meta)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Platform:  &v1.Platform{OS: "linux", Architecture: b.Arch},
		}})
	}
	return mutate.AppendManifests(idx, adds...), nil
}
