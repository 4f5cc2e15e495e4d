// Package plugintest builds real device-module plugins for tests.
//
// A plugin loads only into a binary built with the same settings, so Build
// compiles it with the build settings of the running test binary, read from
// its own build info: tests pass under "go test" with or without -trimpath or
// -race. Building needs the go command on PATH and cgo.
package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// ModuleRoot is the directory holding the main module's go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command(GoTool(t), "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// GoTool is the path of the go command.
func GoTool(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building plugins needs the go command on PATH: %v", err)
	}
	return p
}

// HostFlags are the go build flags that reproduce the running binary's
// build settings.
func HostFlags(t testing.TB) []string {
	t.Helper()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("test binary has no build info")
	}
	s := map[string]string{}
	for _, kv := range bi.Settings {
		s[kv.Key] = kv.Value
	}
	var flags []string
	for _, b := range []string{"-trimpath", "-race", "-msan", "-asan"} {
		if s[b] == "true" {
			flags = append(flags, b)
		}
	}
	for _, v := range []string{"-tags", "-gcflags", "-asmflags"} {
		if s[v] != "" {
			flags = append(flags, v+"="+s[v])
		}
	}
	return flags
}

// Build builds package pkg (e.g. "./plugins/simgpu/plugin") of the module
// in dir with the given go build flags into outDir/name and returns the
// path of the .so.
func Build(t testing.TB, dir, pkg string, flags []string, outDir, name string) string {
	t.Helper()
	out := filepath.Join(outDir, name)
	args := append([]string{"build", "-buildmode=plugin", "-buildvcs=false", "-o", out}, flags...)
	cmd := exec.Command(GoTool(t), append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s %s: %v\n%s", strings.Join(args, " "), pkg, err, b)
	}
	return out
}

// BuildCLibrary compiles C source into the shared library dir/name with
// $CC (default gcc), e.g. a fake vendor library for a module's tests.
func BuildCLibrary(t testing.TB, source, name string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "lib.c")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, name)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return lib
}
