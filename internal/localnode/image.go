package localnode

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Images the harness builds from the host's static busybox.
const (
	// BusyboxImage is the default name of the busybox image.
	BusyboxImage = "docker.io/library/busybox:latest"
	// PauseImage is the pod sandbox image Start imports and configures:
	// busybox that sleeps forever.
	PauseImage = "kubegpu.local/pause:busybox"
	// DefaultBusybox is Debian busybox-static's binary.
	DefaultBusybox = "/bin/busybox"
)

// ImageSpec describes a busybox image.
type ImageSpec struct {
	// Names are the references the image is imported under, each a full
	// reference such as "docker.io/library/busybox:latest" (default:
	// BusyboxImage). They all name the same manifest.
	Names []string
	// Entrypoint and Cmd of the image configuration (default Cmd: sh).
	Entrypoint []string
	Cmd        []string
	// Env are variables of the image configuration ("NAME=VALUE"), after
	// PATH.
	Env []string
	// User is the image's user ("1002", "www-data", "1003:group"; default
	// root). The image's /etc/passwd knows root, www-data (33) and nobody.
	User string
	// Labels of the image configuration; different labels make different
	// image IDs from the same layer.
	Labels map[string]string
	// Passwd and Group are lines added to the image's /etc/passwd and
	// /etc/group.
	Passwd, Group []string
	// Busybox is a statically linked busybox binary (default
	// DefaultBusybox, from Debian's busybox-static).
	Busybox string
}

// OCI media types and the annotations containerd reads on import.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User,omitempty"`
		Labels     map[string]string `json:"Labels,omitempty"`
		Env        []string          `json:"Env"`
		Entrypoint []string          `json:"Entrypoint,omitempty"`
		Cmd        []string          `json:"Cmd,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []struct {
		CreatedBy string `json:"created_by"`
	} `json:"history"`
}

// WriteImageLayout writes the image as an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) into dir, which must be empty or missing.
// The same spec and busybox binary always give the same digests.
func WriteImageLayout(dir string, spec ImageSpec) error {
	files, err := imageFiles(spec)
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write image layout: %w", err)
		}
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return fmt.Errorf("write image layout: %w", err)
		}
	}
	return nil
}

// WriteImageArchive writes the image as a tar of an OCI image layout, the
// format `ctr images import` and Node.ImportImage take.
func WriteImageArchive(path string, spec ImageSpec) error {
	files, err := imageFiles(spec)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		if d := filepath.Dir(f.name); d != "." {
			for _, p := range []string{"blobs", d} {
				if !dirs[p] {
					dirs[p] = true
					if err := tw.WriteHeader(tarHeader(p+"/", tar.TypeDir, 0o755, 0)); err != nil {
						return fmt.Errorf("write image archive: %w", err)
					}
				}
			}
		}
		if err := tw.WriteHeader(tarHeader(f.name, tar.TypeReg, 0o644, int64(len(f.data)))); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("write image archive: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write image archive: %w", err)
	}
	return nil
}

type layoutFile struct {
	name string
	data []byte
}

// imageFiles returns the files of the image's OCI layout, index.json last.
func imageFiles(spec ImageSpec) ([]layoutFile, error) {
	if len(spec.Names) == 0 {
		spec.Names = []string{BusyboxImage}
	}
	if spec.Busybox == "" {
		spec.Busybox = DefaultBusybox
	}
	if len(spec.Entrypoint) == 0 && len(spec.Cmd) == 0 {
		spec.Cmd = []string{"sh"}
	}
	for _, n := range spec.Names {
		if refTag(n) == "" {
			return nil, fmt.Errorf("build image: %q is not a full image reference with a tag, like %s", n, BusyboxImage)
		}
	}

	layer, diffID, err := busyboxLayer(spec)
	if err != nil {
		return nil, err
	}
	var cfg imageConfig
	cfg.Architecture, cfg.OS = runtime.GOARCH, "linux"
	cfg.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, spec.Env...)
	cfg.Config.Entrypoint, cfg.Config.Cmd = spec.Entrypoint, spec.Cmd
	cfg.Config.User, cfg.Config.Labels = spec.User, spec.Labels
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{diffID}
	cfg.History = append(cfg.History, struct {
		CreatedBy string `json:"created_by"`
	}{CreatedBy: "kubegpu internal/localnode: busybox from " + spec.Busybox})

	var files []layoutFile
	blob := func(mediaType string, data []byte) descriptor {
		d := digestOf(data)
		files = append(files, layoutFile{name: "blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), data: data})
		return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	m := manifest{SchemaVersion: 2, MediaType: mediaTypeManifest,
		Config: blob(mediaTypeConfig, cfgJSON), Layers: []descriptor{blob(mediaTypeLayer, layer)}}
	mJSON, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	md := blob(mediaTypeManifest, mJSON)

	idx := index{SchemaVersion: 2, MediaType: mediaTypeIndex}
	for _, n := range spec.Names {
		d := md
		d.Annotations = map[string]string{annotationContainerdName: n, annotationRefName: refTag(n)}
		idx.Manifests = append(idx.Manifests, d)
	}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	files = append(files,
		layoutFile{name: "oci-layout", data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		layoutFile{name: "index.json", data: idxJSON})
	return files, nil
}

// refTag returns the tag of a full reference ("" when it has none).
func refTag(ref string) string {
	slash := strings.LastIndexByte(ref, '/')
	colon := strings.LastIndexByte(ref, ':')
	if slash <= 0 || colon < slash || strings.Contains(ref, "@") {
		return ""
	}
	return ref[colon+1:]
}

// busyboxLayer returns the gzipped layer and the digest of its tar: the
// busybox binary in /bin, a hard link to it per applet (as in Docker's
// busybox image, so that masking one applet's path masks only that one),
// the directories a container expects and an /etc/passwd and /etc/group.
func busyboxLayer(spec ImageSpec) (layer []byte, diffID string, err error) {
	busybox := spec.Busybox
	bin, err := os.ReadFile(busybox)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("build image: %s not found: install Debian's busybox-static (make deps)", busybox)
		}
		return nil, "", fmt.Errorf("build image: %w", err)
	}
	applets, err := busyboxApplets(busybox)
	if err != nil {
		return nil, "", err
	}

	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	write := func(h *tar.Header, data []byte) {
		if err == nil {
			err = tw.WriteHeader(h)
		}
		if err == nil && len(data) > 0 {
			_, err = tw.Write(data)
		}
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "usr/bin", "usr/sbin", "var"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		write(tarHeader(d+"/", tar.TypeDir, mode, 0), nil)
	}
	write(tarHeader("bin/busybox", tar.TypeReg, 0o755, int64(len(bin))), bin)
	for _, a := range applets {
		h := tarHeader("bin/"+a, tar.TypeLink, 0o755, 0)
		h.Linkname = "bin/busybox"
		write(h, nil)
	}
	passwd := []byte(strings.Join(append([]string{"root:x:0:0:root:/root:/bin/sh",
		"www-data:x:33:33:www-data:/var/www:/bin/false",
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false"}, spec.Passwd...), "\n") + "\n")
	group := []byte(strings.Join(append([]string{"root:x:0:", "www-data:x:33:", "nogroup:x:65534:"}, spec.Group...), "\n") + "\n")
	write(tarHeader("etc/group", tar.TypeReg, 0o644, int64(len(group))), group)
	write(tarHeader("etc/passwd", tar.TypeReg, 0o644, int64(len(passwd))), passwd)
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, "", fmt.Errorf("build image layer: %w", err)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz) // no name, no time: reproducible
	if _, err := io.Copy(zw, bytes.NewReader(raw.Bytes())); err != nil {
		return nil, "", fmt.Errorf("build image layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("build image layer: %w", err)
	}
	return gz.Bytes(), digestOf(raw.Bytes()), nil
}

// busyboxApplets lists the applets the binary provides (sh, env, sleep, ...).
func busyboxApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("build image: list the applets of %s (want a static busybox, Debian busybox-static): %w", busybox, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.ContainsRune(a, '/') {
			applets = append(applets, a)
		}
	}
	sort.Strings(applets)
	for _, want := range []string{"sh", "env", "sleep", "cat"} {
		if i := sort.SearchStrings(applets, want); i == len(applets) || applets[i] != want {
			return nil, fmt.Errorf("build image: %s lacks the %s applet", busybox, want)
		}
	}
	return applets, nil
}

func tarHeader(name string, typ byte, mode, size int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: typ, Mode: mode, Size: size,
		ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
