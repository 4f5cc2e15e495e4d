// Command image builds kubegpu's container images, with no base image: the
// files given, the shared libraries the ELF ones need (read from their
// dynamic sections, found on the build machine), a non-root user, and no
// shell. It writes each image as a tar of an OCI image layout, which
// `ctr images import` and registries' tools read, with a docker-save
// manifest.json beside it (as Docker writes since version 25) for `docker
// load` and `crane push`, and prints its digest. The manifest has Docker's
// media types (schema 2), so that the image read through manifest.json,
// which go-containerregistry's tools describe with them, has the digest
// printed.
// The same inputs and -created give the same digest; the inputs include the
// build machine's glibc (libc.so.6 and the loader are copied from it), so
// two machines give the same digest only with the same glibc, as two
// clean checkouts on Debian 12 do. Images are built for amd64, with the
// libraries where Debian's loader looks for them.
//
// Usage:
//
//	image -ref ghcr.io/kubegpu/kubegpu-scheduler:v0.1.0 -out scheduler.tar \
//	  -entrypoint /usr/local/bin/kubegpu-scheduler \
//	  -add _output/bin/kubegpu-scheduler=/usr/local/bin/kubegpu-scheduler \
//	  -add _output/plugins/nvidia.so=/usr/lib/kubegpu/plugins/nvidia.so
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	ref := fs.String("ref", "", "the image's full reference with its tag (host/path/name:tag)")
	out := fs.String("out", "", "the OCI archive to write")
	entrypoint := fs.String("entrypoint", "", "the program the image runs")
	created := fs.Int64("created", 0, "the image's time, seconds since 1970 (default: $SOURCE_DATE_EPOCH, else 0)")
	root := fs.String("root", "/", "where the build machine's shared libraries are")
	var adds, labels list
	fs.Var(&adds, "add", "SRC=DST: put the file SRC at DST in the image (repeatable); ELF files bring their shared libraries")
	fs.Var(&labels, "label", "KEY=VALUE: a label of the image's configuration (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || *out == "" || *entrypoint == "" || len(adds) == 0 {
		return fmt.Errorf("-ref, -out, -entrypoint and at least one -add are required")
	}
	when := time.Unix(*created, 0).UTC()
	if !flagSet(fs, "created") {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			sec, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
			}
			when = time.Unix(sec, 0).UTC()
		}
	}
	spec := Spec{Entrypoint: []string{*entrypoint}, Created: when, Labels: map[string]string{}}
	var elfs []string
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("-add %q: want SRC=DST", a)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if f, err := elf.Open(src); err == nil {
			machine := f.Machine
			f.Close()
			if machine != elf.EM_X86_64 {
				// The libraries are placed where Debian's x86-64 loader
				// looks, and the configuration says amd64.
				return fmt.Errorf("%s is built for %v: images are built for amd64 only", src, machine)
			}
			mode = 0o755
			elfs = append(elfs, src)
		}
		spec.Files = append(spec.Files, File{Path: dst, Mode: mode, Data: data})
	}
	libs, err := SharedLibraries(*root, elfs...)
	if err != nil {
		return err
	}
	spec.Files = append(spec.Files, libs...)
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	img, err := Build(spec)
	if err != nil {
		return err
	}
	digest, err := WriteArchive(*out, *ref, img, when)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s\n", *ref, digest)
	return nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
