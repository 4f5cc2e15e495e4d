package localnode

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func needBusybox(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(DefaultBusybox); err != nil {
		t.Skipf("%s missing: install Debian's busybox-static (make deps)", DefaultBusybox)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// blob reads a blob of the layout and checks its digest and size.
func blob(t *testing.T, dir string, d descriptor) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d.Digest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	if got := digestOf(data); got != d.Digest || int64(len(data)) != d.Size {
		t.Fatalf("blob %s: digest %s, size %d; descriptor says size %d", d.Digest, got, len(data), d.Size)
	}
	return data
}

func TestWriteImageLayout(t *testing.T) {
	needBusybox(t)
	dir := t.TempDir()
	names := []string{BusyboxImage, "registry.k8s.io/e2e-test-images/busybox:1.29-2"}
	spec := ImageSpec{Names: names, Entrypoint: []string{"sleep", "inf"},
		Passwd: []string{"default-user:x:1000:1000::/home/default-user:/bin/sh"}, Group: []string{"extra:x:50000:default-user"}}
	if err := WriteImageLayout(dir, spec); err != nil {
		t.Fatal(err)
	}

	var idx index
	readJSON(t, filepath.Join(dir, "index.json"), &idx)
	if len(idx.Manifests) != len(names) {
		t.Fatalf("index has %d manifests, want one per name (%d)", len(idx.Manifests), len(names))
	}
	for i, want := range names {
		a := idx.Manifests[i].Annotations
		if a[annotationContainerdName] != want || a[annotationRefName] != refTag(want) {
			t.Errorf("manifest %d annotations %v, want name %s", i, a, want)
		}
		if idx.Manifests[i].Digest != idx.Manifests[0].Digest {
			t.Errorf("names do not share one manifest")
		}
	}

	var m manifest
	if err := json.Unmarshal(blob(t, dir, idx.Manifests[0]), &m); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(t, dir, m.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "sleep inf" {
		t.Errorf("entrypoint %q, want sleep inf", got)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(m.Layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(t, dir, m.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if got := digestOf(raw); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != got {
		t.Errorf("diff_ids %v, want [%s]", cfg.RootFS.DiffIDs, got)
	}

	entries := map[string]*tar.Header{}
	contents := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = h
		if strings.HasPrefix(h.Name, "etc/") {
			data, _ := io.ReadAll(tr)
			contents[h.Name] = string(data)
		}
	}
	if p := contents["etc/passwd"]; !strings.HasPrefix(p, "root:x:0:0:") || !strings.Contains(p, "\ndefault-user:x:1000:") {
		t.Errorf("etc/passwd:\n%s\nwant root first and the extra user", p)
	}
	if g := contents["etc/group"]; !strings.Contains(g, "\nextra:x:50000:default-user\n") {
		t.Errorf("etc/group:\n%s\nwant the extra group", g)
	}
	if h := entries["bin/busybox"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
		t.Errorf("bin/busybox missing or not executable: %+v", h)
	}
	for _, applet := range []string{"sh", "env", "sleep", "cat", "ls"} {
		if h := entries["bin/"+applet]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "bin/busybox" {
			t.Errorf("bin/%s is not a hard link to bin/busybox: %+v", applet, h)
		}
	}
	for _, f := range []string{"etc/passwd", "etc/group", "tmp/", "proc/", "dev/"} {
		if entries[f] == nil {
			t.Errorf("%s missing from the layer", f)
		}
	}
}

func TestWriteImageArchiveIsReproducible(t *testing.T) {
	needBusybox(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	for _, p := range []string{a, b} {
		if err := WriteImageArchive(p, ImageSpec{}); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Fatal("two archives of the same image differ")
	}
	// The archive holds an OCI layout: oci-layout, index.json, blobs.
	seen := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(da))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = true
	}
	for _, want := range []string{"oci-layout", "index.json", "blobs/sha256/"} {
		if !seen[want] {
			t.Errorf("archive lacks %s", want)
		}
	}
}

func TestImageSpecErrors(t *testing.T) {
	dir := t.TempDir()
	if err := WriteImageLayout(dir, ImageSpec{Names: []string{"busybox"}}); err == nil || !strings.Contains(err.Error(), "full image reference") {
		t.Errorf("a name without a tag: got %v, want an error naming a full reference", err)
	}
	err := WriteImageLayout(dir, ImageSpec{Busybox: filepath.Join(dir, "no-busybox")})
	if err == nil || !strings.Contains(err.Error(), "busybox-static") {
		t.Errorf("a missing busybox: got %v, want an error naming busybox-static", err)
	}
}

func TestRefTag(t *testing.T) {
	for ref, want := range map[string]string{
		"docker.io/library/busybox:latest":               "latest",
		"127.0.0.1:5000/e2e-test-images/busybox:1.29-2":  "1.29-2",
		"127.0.0.1:5000/busybox":                         "",
		"busybox:latest":                                 "",
		"docker.io/library/busybox@sha256:0123456789abc": "",
	} {
		if got := refTag(ref); got != want {
			t.Errorf("refTag(%q) = %q, want %q", ref, got, want)
		}
	}
}
