package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestReproducible: the same inputs give the same digest and the same
// archive bytes; the image runs as the non-root user, carries the
// program's shared libraries and no shell.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	prog := "/bin/true"
	build := func(name string) (string, []byte) {
		t.Helper()
		out := filepath.Join(dir, name)
		if err := run([]string{"-ref", "example.com/kubegpu/true:v1", "-out", out, "-entrypoint", "/usr/local/bin/true",
			"-add", prog + "=/usr/local/bin/true", "-label", "org.opencontainers.image.version=v1", "-created", "1700000000"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return out, b
	}
	out, a := build("a.tar")
	_, b := build("b.tar")
	if string(a) != string(b) {
		t.Fatal("two builds of the same inputs differ")
	}

	// Unpack the archive and read the image back.
	layoutDir := filepath.Join(dir, "layout")
	untar(t, out, layoutDir)
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["io.containerd.image.name"] != "example.com/kubegpu/true:v1" {
		t.Fatalf("index: %+v", m.Manifests)
	}
	img, err := p.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// The same image read through the archive's docker-save manifest.json,
	// as `docker load` and `crane push` of the file do: the same digest.
	tag, err := name.NewTag("example.com/kubegpu/true:v1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []*name.Tag{nil, &tag} {
		viaTarball, err := tarball.ImageFromPath(out, tag)
		if err != nil {
			t.Fatal(err)
		}
		got, err := viaTarball.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if got != m.Manifests[0].Digest {
			t.Errorf("read as a docker-save archive (tag %v) the image's digest is %v, want the OCI layout's %v", tag, got, m.Manifests[0].Digest)
		}
		if err := validate.Image(viaTarball); err != nil {
			t.Errorf("read as a docker-save archive: %v", err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Entrypoint[0] != "/usr/local/bin/true" || cf.Config.Labels["org.opencontainers.image.version"] != "v1" {
		t.Errorf("config: %+v", cf.Config)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatal(len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s: owner %d, time %v", h.Name, h.Uid, h.ModTime)
		}
		files[h.Name] = true
	}
	for _, want := range []string{"usr/local/bin/true", "lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2", "etc/passwd", "tmp/"} {
		if !files[want] {
			t.Errorf("image lacks %s", want)
		}
	}
	for name := range files {
		if strings.HasSuffix(name, "/sh") || strings.Contains(name, "busybox") {
			t.Errorf("image has a shell: %s", name)
		}
	}
}

// TestRefused: bad input gets a clear error.
func TestRefused(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-ref", "true:v1", "-out", filepath.Join(dir, "x"), "-entrypoint", "/t", "-add", "/bin/true=/t"}, "not a full reference"},
		{[]string{"-ref", "a.com/true:v1", "-out", filepath.Join(dir, "x"), "-entrypoint", "/t", "-add", "/bin/true"}, "want SRC=DST"},
		{[]string{"-ref", "a.com/true:v1", "-out", filepath.Join(dir, "x"), "-entrypoint", "/t", "-add", "/bin/true=t"}, "not a clean absolute path"},
		{[]string{"-ref", "a.com/true:v1", "-out", filepath.Join(dir, "x"), "-entrypoint", "/t", "-add", "/bin/true=/t", "-root", dir}, "ld-linux-x86-64.so.2: no such file"},
	} {
		err := run(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
