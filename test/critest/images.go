package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
)

// Images critest uses (cri-tools v1.34.0, pkg/validate and pkg/framework),
// as it names them.
const (
	e2e     = "registry.k8s.io/e2e-test-images/"
	staging = "gcr.io/k8s-staging-cri-tools/"
)

// testImage is an image critest pulls: the names it uses, whether prefix
// mode imports it into containerd under them (those critest creates
// containers from without the registry prefix), and how the busybox
// standing in for it differs from plain busybox.
type testImage struct {
	names []string
	local bool
	spec  localnode.ImageSpec
}

// testImages returns critest's images. Each gets an image ID of its own (a
// label): the image specs remove what they pulled by ID, which would
// otherwise remove every other name of the same busybox too. The web
// servers are busybox httpd, the users and groups those of cri-tools'
// images/ Dockerfiles.
func testImages() []testImage {
	images := []testImage{
		{names: []string{e2e + "busybox:1.29-2"}, local: true},
		{names: []string{e2e + "nginx:1.14-2"}, local: true, spec: webServer("nginx", 80)},
		{names: []string{e2e + "nonewprivs:1.3"}, local: true},
		{names: []string{e2e + "httpd:2.4.39-4"}, local: true, spec: webServer("httpd", 80)},
		{names: []string{staging + "hostnet-nginx-" + runtime.GOARCH + ":latest"}, local: true, spec: webServer("nginx", 12003)},
		{names: []string{staging + "test-image-latest:latest"}},
		{names: []string{staging + "test-image-tag:test", staging + "test-image-tag:all"}},
		{names: []string{staging + "test-image-digest:latest"}},
		{names: []string{staging + "test-image-tags:1", staging + "test-image-tags:2", staging + "test-image-tags:3"}},
		{names: []string{staging + "test-image-1:latest"}},
		{names: []string{staging + "test-image-2:latest"}},
		{names: []string{staging + "test-image-3:latest"}},
		{names: []string{staging + "test-image-predefined-group:latest"}, local: true, spec: localnode.ImageSpec{User: "1000",
			Passwd: []string{"default-user:x:1000:1000::/home/default-user:/bin/sh"},
			Group:  []string{"default-user:x:1000:", "group-defined-in-image:x:50000:default-user"}}},
	}
	// Images whose user the image specs check.
	for name, user := range map[string]string{
		"test-image-user-uid":            "1002",
		"test-image-user-username":       "www-data",
		"test-image-user-uid-group":      "1003:users",
		"test-image-user-username-group": "www-data:users",
	} {
		images = append(images, testImage{names: []string{staging + name + ":latest"}, spec: localnode.ImageSpec{User: user}})
	}
	sort.Slice(images, func(i, j int) bool { return images[i].names[0] < images[j].names[0] })
	for i := range images {
		images[i].spec.Names = images[i].names
		images[i].spec.Labels = map[string]string{"io.kubegpu.critest.image": images[i].names[0]}
	}
	return images
}

// webServer is busybox httpd standing in for nginx or httpd: it says its
// name in its log, serves a page on port, and writes nginx's pid file.
func webServer(name string, port int) localnode.ImageSpec {
	script := fmt.Sprintf("echo %[1]s: busybox httpd on port %[2]d; mkdir -p /www /var/run; "+
		"echo '<h1>Welcome to %[1]s!</h1>' >/www/index.html; echo $$ >/var/run/nginx.pid; "+
		"exec httpd -f -p %[2]d -h /www", name, port)
	return localnode.ImageSpec{Entrypoint: []string{"sh", "-c", script}}
}

// mirroredRegistries are the registries critest's images come from.
var mirroredRegistries = []string{"registry.k8s.io", "gcr.io"}

// repository is where the loopback registry serves an image name: its path
// without the registry host. With a prefix, cri-tools 1.34 drops the tag,
// so every image is pushed as :latest.
func repository(name string, prefix bool) string {
	_, path, _ := strings.Cut(name, "/")
	if prefix {
		if i := strings.LastIndexByte(path, ':'); i > strings.LastIndexByte(path, '/') {
			path = path[:i]
		}
	}
	return path
}

// importImages imports the test images critest uses unprefixed into
// containerd under their original names.
func importImages(ctx context.Context, ctr, address, dir string, images []testImage) error {
	for i, img := range images {
		if !img.local {
			continue
		}
		archive := filepath.Join(dir, "images", fmt.Sprintf("image-%d.tar", i))
		if err := localnode.WriteImageArchive(archive, img.spec); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, ctr, "--address", address, "--namespace", localnode.Namespace, "images", "import", archive)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("import %s into %s: %w: %s", strings.Join(img.names, ", "), address, err, out)
		}
	}
	return nil
}

// startRegistry serves every image under its repository and returns the
// registry's host:port.
func startRegistry(ctx context.Context, o options, dir string, images []testImage, layouts []string, prefix bool) (*localcluster.Process, string, error) {
	addrFile := filepath.Join(dir, "registry.addr")
	args := []string{"--addr-file", addrFile}
	for i, img := range images {
		for _, n := range img.names {
			args = append(args, repository(n, prefix)+"="+layouts[i])
		}
	}
	logPath := filepath.Join(o.outDir, "registry.log")
	_ = os.Remove(logPath)
	p, err := localcluster.StartProcess(logPath, filepath.Join(o.binDir, "loopback-registry"), args...)
	if err != nil {
		return nil, "", fmt.Errorf("start loopback-registry: %w", err)
	}
	var addr string
	err = p.WaitFor(ctx, 30*time.Second, func(context.Context) error {
		data, err := os.ReadFile(addrFile)
		if err != nil {
			return errors.New("registry has not pushed the images yet")
		}
		addr = strings.TrimSpace(string(data))
		return nil
	})
	if err != nil {
		_ = p.Stop()
		return nil, "", err
	}
	return p, addr, nil
}
