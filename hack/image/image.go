package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the user and group the images run as.
const NonRoot = 65532

// File is one file of an image's root filesystem.
type File struct {
	// Path is absolute, in the image.
	Path string
	Mode int64
	Data []byte
}

// Spec is an image: its files (directories are added for them) and its
// configuration.
type Spec struct {
	Files      []File
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	// Created is the time recorded in the configuration and on every file;
	// a fixed value makes the image reproducible.
	Created time.Time
}

// Build assembles the image: one layer, files in name order, owned by
// root, with Spec.Created as their time; the configuration runs
// Entrypoint as NonRoot. The same Spec gives the same digest.
func Build(spec Spec) (v1.Image, error) {
	layer, err := layerOf(spec)
	if err != nil {
		return nil, err
	}
	// Docker's media types (schema 2), which every runtime and registry
	// reads: a docker-save archive's manifest.json describes the image
	// with them, so that tools that push the archive through it (crane
	// push) push the very manifest, and digest, of the OCI layout.
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.DockerManifestSchema2), layer)
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.User = fmt.Sprintf("%d:%d", NonRoot, NonRoot)
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, spec.Env...)
	cf.Config.Labels = spec.Labels
	cf.Config.WorkingDir = "/"
	cf.History = []v1.History{{Created: v1.Time{Time: spec.Created}, CreatedBy: "kubegpu hack/image"}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	return img, nil
}

// layerOf is the image's one layer: its files, the directories above them,
// and /etc/passwd, /etc/group and /tmp for a non-root process.
func layerOf(spec Spec) (v1.Layer, error) {
	files := append([]File{}, spec.Files...)
	files = append(files,
		File{Path: "/etc/passwd", Mode: 0o644, Data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nkubegpu:x:%d:%d:kubegpu:/nonexistent:/sbin/nologin\n", NonRoot, NonRoot)},
		File{Path: "/etc/group", Mode: 0o644, Data: fmt.Appendf(nil, "root:x:0:\nkubegpu:x:%d:\n", NonRoot)},
		File{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
	)
	dirs := map[string]int64{"/tmp": 0o1777}
	seen := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("build image: %q is not a clean absolute path", f.Path)
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("build image: %s twice", f.Path)
		}
		seen[f.Path] = true
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	type entry struct {
		h    *tar.Header
		data []byte
	}
	var entries []entry
	for d, mode := range dirs {
		entries = append(entries, entry{h: &tar.Header{Name: d[1:] + "/", Typeflag: tar.TypeDir, Mode: mode}})
	}
	for _, f := range files {
		entries = append(entries, entry{h: &tar.Header{Name: f.Path[1:], Typeflag: tar.TypeReg, Mode: f.Mode, Size: int64(len(f.Data))}, data: f.Data})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].h.Name < entries[j].h.Name })
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		e.h.ModTime, e.h.Format = spec.Created, tar.FormatPAX
		if err := tw.WriteHeader(e.h); err != nil {
			return nil, fmt.Errorf("build image layer: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("build image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("build image layer: %w", err)
	}
	b := raw.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return nil, fmt.Errorf("build image layer: %w", err)
	}
	return layer, nil
}

// WriteArchive writes img as a tar of an OCI image layout at archive,
// named ref (a full reference with a tag) the way `ctr images import`
// and registries' tools read it, with the manifest.json of `docker save`
// beside it (as Docker writes since version 25) for the tools that read
// only that (`docker load`, `crane push` of a file). It returns the
// manifest's digest.
func WriteArchive(archive, ref string, img v1.Image, created time.Time) (v1.Hash, error) {
	colon, slash := strings.LastIndexByte(ref, ':'), strings.LastIndexByte(ref, '/')
	if slash <= 0 || colon < slash {
		return v1.Hash{}, fmt.Errorf("write image: %q is not a full reference with a tag (host/path/name:tag)", ref)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(archive), ".layout-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": ref[colon+1:],
	})); err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	if err := writeDockerManifest(dir, ref, img); err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	var out bytes.Buffer
	if err := tarDir(&out, dir, created); err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	tmp := archive + ".tmp"
	if err := os.WriteFile(tmp, out.Bytes(), 0o644); err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	if err := os.Rename(tmp, archive); err != nil {
		return v1.Hash{}, fmt.Errorf("write image: %w", err)
	}
	return digest, nil
}

// dockerManifest is one image of a docker-save archive's manifest.json:
// paths of its configuration and layers in the archive.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// writeDockerManifest writes manifest.json into the OCI layout dir, naming
// img's blobs there.
func writeDockerManifest(dir, ref string, img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }
	d := dockerManifest{Config: blob(m.Config.Digest), RepoTags: []string{ref}}
	for _, l := range m.Layers {
		d.Layers = append(d.Layers, blob(l.Digest))
	}
	b, err := json.Marshal([]dockerManifest{d})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644)
}

// tarDir writes the files under dir to w, in name order, with fixed times
// and owners.
func tarDir(w io.Writer, dir string, created time.Time) error {
	var names []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, p := range names {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, dir+string(filepath.Separator)))
		h := &tar.Header{Name: rel, Mode: 0o644, ModTime: created, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: st.Size()}
		if st.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = rel+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !st.IsDir() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// libDirs are where the dynamic loader of Debian's glibc looks when there
// is no /etc/ld.so.cache, and so where the image keeps the libraries.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// SharedLibraries returns the files the ELF binaries need to run: their
// interpreter at the path they name, and every library they need
// (transitively), found in libDirs under root ("/" on a build machine)
// and placed in the image's first libDirs entry.
func SharedLibraries(root string, binaries ...string) ([]File, error) {
	var out []File
	done := map[string]bool{}
	var need func(bin string) error
	need = func(bin string) error {
		f, err := elf.Open(bin)
		if err != nil {
			return fmt.Errorf("shared libraries of %s: %w", bin, err)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return fmt.Errorf("shared libraries of %s: interpreter: %w", bin, err)
			}
			interp := strings.TrimRight(string(b), "\x00")
			if !done[interp] {
				done[interp] = true
				data, err := os.ReadFile(filepath.Join(root, interp))
				if err != nil {
					return fmt.Errorf("shared libraries of %s: interpreter: %w", bin, err)
				}
				out = append(out, File{Path: interp, Mode: 0o755, Data: data})
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("shared libraries of %s: %w", bin, err)
		}
		for _, lib := range libs {
			if done[lib] {
				continue
			}
			done[lib] = true
			found := ""
			for _, d := range libDirs {
				p := filepath.Join(root, d, lib)
				if _, err := os.Stat(p); err == nil {
					found = p
					break
				} else if !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("shared libraries of %s: %w", bin, err)
				}
			}
			if found == "" {
				return fmt.Errorf("shared libraries of %s: %s not found in %s", bin, lib, strings.Join(libDirs, ", "))
			}
			data, err := os.ReadFile(found)
			if err != nil {
				return fmt.Errorf("shared libraries of %s: %w", bin, err)
			}
			out = append(out, File{Path: path.Join(libDirs[0], lib), Mode: 0o755, Data: data})
			if err := need(found); err != nil {
				return err
			}
		}
		return nil
	}
	for _, b := range binaries {
		if err := need(b); err != nil {
			return nil, err
		}
	}
	return out, nil
}
