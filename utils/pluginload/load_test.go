package pluginload

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kubegpu/kubegpu/utils/plugintest"
)

// These tests build real plugins with go build -buildmode=plugin and load
// them into the test binary. Each plugin is built with the flags the test
// binary was built with (read from its own build info), so the tests pass
// under "go test" with or without -trimpath or -race; the mismatch tests then
// change one thing on purpose.

// buildPlugin builds package pkg of the module in dir into a .so in a new
// temp directory and returns its path.
func buildPlugin(t *testing.T, dir, pkg string, flags []string) string {
	t.Helper()
	return plugintest.Build(t, dir, pkg, flags, t.TempDir(), filepath.Base(pkg)+".so")
}

var (
	goodOnce sync.Once
	goodPath string
	// sharedDir outlives single tests: Go never unloads a plugin, and the
	// runtime refuses a second copy of one it has loaded, so every test
	// that needs the good plugin uses this one file.
	sharedDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pluginload-test-")
	if err != nil {
		panic(err)
	}
	sharedDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// goodPlugin builds testdata/good once per test binary, alone in its own
// directory.
func goodPlugin(t *testing.T) string {
	t.Helper()
	goodOnce.Do(func() {
		built := buildPlugin(t, plugintest.ModuleRoot(t), "./utils/pluginload/testdata/good", plugintest.HostFlags(t))
		dir := filepath.Join(sharedDir, "good")
		copyFile(t, built, filepath.Join(dir, "testmod.so"))
		goodPath = filepath.Join(dir, "testmod.so")
	})
	if goodPath == "" {
		t.Fatal("building the good plugin failed earlier")
	}
	return goodPath
}

func TestOpenGood(t *testing.T) {
	m, err := Open(goodPlugin(t))
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	if m.Name() != "testmod" {
		t.Errorf("Name() = %q, want testmod", m.Name())
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := filepath.Dir(goodPlugin(t))
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a plugin"), 0o644); err != nil {
		t.Fatal(err)
	}
	mods, err := Load(dir, nil)
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	if got := Names(mods); len(got) != 1 || got[0] != "testmod" {
		t.Errorf("Load() modules = %v, want [testmod]", got)
	}

	empty, err := Load(t.TempDir(), nil)
	if err != nil || len(empty) != 0 {
		t.Errorf("Load(empty dir) = %v, %v; want no modules, no error", empty, err)
	}
	if _, err := Load(filepath.Join(dir, "missing"), nil); err == nil || !strings.Contains(err.Error(), "open plugin directory") {
		t.Errorf("Load(missing dir) error = %v", err)
	}
}

// TestLoadEachKeepsTheGoodModules: a file that does not load (here not a
// Go plugin at all, as a truncated copy would be) is reported by name
// beside the modules that loaded; Load fails the whole directory for it.
func TestLoadEachKeepsTheGoodModules(t *testing.T) {
	dir := filepath.Dir(goodPlugin(t))
	garbage := filepath.Join(dir, "broken.so")
	if err := os.WriteFile(garbage, []byte("\x7fELF truncated"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(garbage) })
	mods, failures, err := LoadEach(dir, nil)
	if err != nil {
		t.Fatalf("LoadEach() error = %v", err)
	}
	if got := Names(mods); len(got) != 1 || got[0] != "testmod" {
		t.Errorf("LoadEach() modules = %v, want [testmod]", got)
	}
	if len(failures) != 1 || failures[0].Path != garbage || !errors.Is(failures[0], ErrNotModule) ||
		!strings.Contains(failures[0].Error(), "broken.so") {
		t.Errorf("LoadEach() failures = %v, want one for %s wrapping ErrNotModule", failures, garbage)
	}
	if mods, err := Load(dir, nil); err == nil || mods != nil || !errors.Is(err, ErrNotModule) {
		t.Errorf("Load() = %v, %v; want no modules and the broken file's error", mods, err)
	}
	if _, _, err := LoadEach(filepath.Join(dir, "missing"), nil); err == nil || !strings.Contains(err.Error(), "open plugin directory") {
		t.Errorf("LoadEach(missing dir) error = %v", err)
	}
}

func TestLoadCopyOfLoadedPlugin(t *testing.T) {
	good := goodPlugin(t)
	if _, err := Open(good); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyFile(t, good, filepath.Join(dir, "copy.so"))
	_, err := Load(dir, nil)
	if err == nil || !strings.Contains(err.Error(), "copy of a plugin this process already loaded") {
		t.Errorf("Load(copy) error = %v", err)
	}
}

func TestLoadFailures(t *testing.T) {
	root := plugintest.ModuleRoot(t)
	// Built without -trimpath when the host has it, or the other way round.
	flipped := plugintest.HostFlags(t)
	wantFlip := "build setting -trimpath: host true, plugin (unset)"
	if i := slices.Index(flipped, "-trimpath"); i >= 0 {
		flipped = append(flipped[:i], flipped[i+1:]...)
	} else {
		flipped = append(flipped, "-trimpath")
		wantFlip = "build setting -trimpath: host (unset), plugin true"
	}

	notSO := filepath.Join(t.TempDir(), "text.so")
	if err := os.WriteFile(notSO, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		path    string
		wantIs  error
		wantMsg []string
	}{
		{
			name:    "different build flags",
			path:    buildPlugin(t, root, "./utils/pluginload/testdata/good", flipped),
			wantIs:  ErrMismatch,
			wantMsg: []string{"good.so was not built with", wantFlip, RebuildHint},
		},
		{
			name:    "shared package changed",
			path:    buildChangedTypesPlugin(t, root),
			wantIs:  ErrMismatch,
			wantMsg: []string{"good.so was not built with", "package github.com/kubegpu/kubegpu/types differs", RebuildHint},
		},
		{
			name:    "no constructor",
			path:    buildPlugin(t, root, "./utils/pluginload/testdata/nosymbol", plugintest.HostFlags(t)),
			wantIs:  ErrNotModule,
			wantMsg: []string{"nosymbol.so", "does not export NewModule"},
		},
		{
			name:    "constructor of the wrong type",
			path:    buildPlugin(t, root, "./utils/pluginload/testdata/wrongtype", plugintest.HostFlags(t)),
			wantIs:  ErrNotModule,
			wantMsg: []string{"wrongtype.so", "NewModule is a func() string, want func() types.Module"},
		},
		{
			name:    "not a Go plugin",
			path:    notSO,
			wantIs:  ErrNotModule,
			wantMsg: []string{"text.so", "cannot read Go build info", "go build -buildmode=plugin"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(tt.path)
			if !errors.Is(err, tt.wantIs) {
				t.Fatalf("Open() error = %v, want %v", err, tt.wantIs)
			}
			for _, w := range tt.wantMsg {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open() error = %q\nwant it to contain %q", err, w)
				}
			}

			// Load reports the same failure for the directory holding it
			// (each plugin was built alone into a directory of its own).
			if _, err := Load(filepath.Dir(tt.path), nil); !errors.Is(err, tt.wantIs) {
				t.Errorf("Load() error = %v, want %v", err, tt.wantIs)
			}
		})
	}
}

// buildChangedTypesPlugin builds testdata/good against a copy of the module
// whose types package has one more constant: same module versions, same
// flags, different source. Only the Go runtime can tell.
func buildChangedTypesPlugin(t *testing.T, root string) string {
	t.Helper()
	tmp := t.TempDir()
	copyFile(t, filepath.Join(root, "go.mod"), filepath.Join(tmp, "go.mod"))
	copyFile(t, filepath.Join(root, "go.sum"), filepath.Join(tmp, "go.sum"))
	srcs, _ := filepath.Glob(filepath.Join(root, "types", "*.go"))
	for _, src := range srcs {
		if !strings.HasSuffix(src, "_test.go") {
			copyFile(t, src, filepath.Join(tmp, "types", filepath.Base(src)))
		}
	}
	f, err := os.OpenFile(filepath.Join(tmp, "types", "doc.go"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n// ChangedForTest makes this copy differ.\nconst ChangedForTest = 1\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	copyFile(t, filepath.Join(root, "utils/pluginload/testdata/good/main.go"), filepath.Join(tmp, "plug/good/main.go"))
	return buildPlugin(t, tmp, "./plug/good", plugintest.HostFlags(t))
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
