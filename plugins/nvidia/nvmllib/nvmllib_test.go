package nvmllib

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kubegpu/kubegpu/utils/plugintest"
)

func TestGeneratedFromGoModVersion(t *testing.T) {
	// The test runs in the package directory; go.mod is above it.
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the package directory")
		}
		dir = parent
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "github.com/NVIDIA/go-nvml" {
			if f[1] != generatedFrom {
				t.Fatalf("the trampolines were generated from go-nvml %s but go.mod requires %s: run go generate ./plugins/nvidia/nvmllib", generatedFrom, f[1])
			}
			return
		}
	}
	t.Fatal("go.mod does not require github.com/NVIDIA/go-nvml")
}

func TestSymbols(t *testing.T) {
	s := Symbols()
	if !slices.IsSorted(s) || len(s) < 100 || !slices.Contains(s, "nvmlInit_v2") || !slices.Contains(s, "nvmlErrorString") {
		t.Errorf("Symbols() = %d names, sorted %v", len(s), slices.IsSorted(s))
	}
}

// fakeNVML is a C library with a few NVML functions: enough for go-nvml's
// Init, DeviceGetCount and ErrorString.
const fakeNVML = `
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 3; return 0; }
const char *nvmlErrorString(int r) { return r == 13 ? "Function Not Found" : "fake"; }
`

// buildFake compiles fakeNVML into a shared library.
func buildFake(t *testing.T) string {
	t.Helper()
	return plugintest.BuildCLibrary(t, fakeNVML, "libnvidia-ml.so.1")
}

// TestOpen runs go-nvml's real (cgo) library through the trampolines: not
// bound, bound to a missing library, bound to a fake one. The order matters:
// the first successful Open binds the process for good.
func TestOpen(t *testing.T) {
	// Unbound: every function answers FUNCTION_NOT_FOUND instead of crashing.
	if _, err := Open(filepath.Join(t.TempDir(), "missing", DefaultPath)); !errors.Is(err, ErrNotFound) ||
		!strings.Contains(err.Error(), "cannot open shared object file") {
		t.Fatalf("Open(missing) error = %v, want ErrNotFound with the loader's reason", err)
	}
	if _, err := Open(""); err == nil {
		t.Error("Open(\"\") succeeded")
	}

	if Has("nvmlDeviceGetCount_v2") {
		t.Error("Has before Open reported a function")
	}
	fake := buildFake(t)
	n, err := Open(fake)
	if err != nil {
		t.Fatalf("Open(fake) error = %v", err)
	}
	if n != 4 {
		t.Errorf("Open(fake) bound %d functions, want 4", n)
	}
	if !Has("nvmlDeviceGetCount_v2") || Has("nvmlDeviceSetMemoryLimits_v1") {
		t.Error("Has does not follow what the library exports")
	}
	lib := nvml.New(nvml.WithLibraryPath(fake))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init() = %v", ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("Shutdown() = %v", ret)
		}
	}()
	if count, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS || count != 3 {
		t.Errorf("DeviceGetCount() = %d, %v; want 3 from the fake library", count, ret)
	}
	// A function the fake library lacks.
	if _, ret := lib.DeviceGetHandleByIndex(0); ret != nvml.ERROR_FUNCTION_NOT_FOUND {
		t.Errorf("DeviceGetHandleByIndex() = %v, want ERROR_FUNCTION_NOT_FOUND", ret)
	}
	if _, err := Open(fake); err != nil {
		t.Errorf("second Open(same path) error = %v", err)
	}
	if _, err := Open(DefaultPath); err == nil || !strings.Contains(err.Error(), "already uses "+fake) {
		t.Errorf("Open(other path) error = %v, want already uses %s", err, fake)
	}
}
