// Command loopback-registry serves an in-memory OCI registry on loopback and
// pushes OCI image layouts into it under the repositories it is given, so
// that a container runtime without internet can pull images by name (critest
// pulls everything it runs). It prints the registry's address, writes it to
// --addr-file once every image is pushed, and serves until it is killed.
//
// Usage:
//
//	loopback-registry [--layout DIR] [--listen 127.0.0.1:0] [--addr-file FILE] REPO[:TAG][=LAYOUT]...
//
// Each REPO gets the first image of its own LAYOUT directory, or of --layout.
// A REPO without a tag is pushed as :latest. Plain HTTP: containerd pulls
// from 127.0.0.1 over HTTP without extra configuration.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loopback-registry:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve the registry on")
	layoutDir := flag.String("layout", "", "OCI image layout directory whose first image is pushed where a repository names none")
	addrFile := flag.String("addr-file", "", "file to write the registry's host:port to once it serves")
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		return errors.New("want at least one repository")
	}
	images := map[string]v1.Image{}
	for _, arg := range flag.Args() {
		_, dir, ok := strings.Cut(arg, "=")
		if !ok {
			dir = *layoutDir
		}
		if dir == "" {
			return fmt.Errorf("%s: no layout: give REPO=LAYOUT or --layout", arg)
		}
		if images[dir] == nil {
			img, err := firstImage(dir)
			if err != nil {
				return err
			}
			images[dir] = img
		}
	}

	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	addr := l.Addr().String()
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(os.Stderr, "registry: ", log.LstdFlags)))}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()

	for _, arg := range flag.Args() {
		repo, dir, ok := strings.Cut(arg, "=")
		if !ok {
			dir = *layoutDir
		}
		img := images[dir]
		ref := addr + "/" + strings.TrimPrefix(repo, "/")
		tag, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			return fmt.Errorf("parse %q: %w", ref, err)
		}
		if err := remote.Write(tag, img); err != nil {
			return fmt.Errorf("push %s: %w", tag, err)
		}
		fmt.Fprintln(os.Stderr, "loopback-registry: pushed", tag.Name())
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile+".tmp", []byte(addr+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(*addrFile+".tmp", *addrFile); err != nil {
			return err
		}
	}
	fmt.Println(addr)
	return <-errc
}

// firstImage returns the first image of the layout's index.
func firstImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	if len(m.Manifests) == 0 {
		return nil, fmt.Errorf("OCI layout %s has no images", dir)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("read image %s from %s: %w", m.Manifests[0].Digest, dir, err)
	}
	return img, nil
}
