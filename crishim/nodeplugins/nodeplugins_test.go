package nodeplugins

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kubegpu/kubegpu/utils/pluginload"
	"github.com/kubegpu/kubegpu/utils/plugintest"
)

var (
	modulesOnce sync.Once
	modulesPath string
)

// modulesDir returns a directory holding freshly built simgpu.so and
// nvidia.so. It lives for the whole test binary: Go never unloads a plugin.
func modulesDir(t *testing.T) string {
	t.Helper()
	modulesOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nodeplugins-test-")
		if err != nil {
			t.Fatal(err)
		}
		root, flags := plugintest.ModuleRoot(t), plugintest.HostFlags(t)
		plugintest.Build(t, root, "./plugins/simgpu/plugin", flags, dir, "simgpu.so")
		plugintest.Build(t, root, "./plugins/nvidia/plugin", flags, dir, "nvidia.so")
		modulesPath = dir
	})
	if modulesPath == "" {
		t.Fatal("building the modules failed earlier")
	}
	return modulesPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if modulesPath != "" {
		os.RemoveAll(modulesPath)
	}
	os.Exit(code)
}

// TestOpenSkipsAndReports checks that one module that cannot start never
// stops the others: a module without devices on this node (NVIDIA without
// NVML here) is skipped with a log line, one that fails otherwise is
// reported in the error beside the modules that started.
func TestOpenSkipsAndReports(t *testing.T) {
	dir := modulesDir(t)
	// An explicit path, so that the test also holds on a machine with a driver.
	noNVML := "nvidia.nvml-library=" + filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	tests := []struct {
		name        string
		options     []string
		wantModules []string
		wantErr     []string
		wantLog     string
	}{
		{
			name:        "nvidia without NVML is skipped",
			options:     []string{"simgpu.preset=t4x4", noNVML},
			wantModules: []string{"simgpu"},
			wantLog:     `Device module has nothing to serve on this node; continuing without it module="nvidia"`,
		},
		{
			name:        "misconfigured nvidia is reported, simgpu starts",
			options:     []string{"simgpu.preset=t4x4", "nvidia.edits=magic"},
			wantModules: []string{"simgpu"},
			wantErr:     []string{"device module nvidia (" + filepath.Join(dir, "nvidia.so") + "): nvidia: option nvidia.edits must be env or cdi"},
		},
		{
			name:    "both fail in their own way",
			options: []string{noNVML},
			wantErr: []string{"device module simgpu (" + filepath.Join(dir, "simgpu.so") + "): simgpu: set simgpu.preset=NAME"},
			wantLog: "NVML is not available on this node: NVML library not found",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			plugins, failures := Open(ctx, dir, "node-a", tt.options, nil)
			err := Errors(failures)
			defer func() {
				if err := Close(plugins); err != nil {
					t.Errorf("Close() error = %v", err)
				}
			}()
			var got []string
			for _, p := range plugins {
				got = append(got, p.Module)
				if _, err := p.Discover(ctx); err != nil {
					t.Errorf("%s: Discover() error = %v", p.Module, err)
				}
			}
			if !slices.Equal(got, tt.wantModules) {
				t.Errorf("started modules = %v, want %v", got, tt.wantModules)
			}
			switch {
			case len(tt.wantErr) == 0 && err != nil:
				t.Errorf("Open() error = %v", err)
			case len(tt.wantErr) > 0 && err == nil:
				t.Errorf("Open() error = nil, want %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if err != nil && !strings.Contains(err.Error(), want) {
					t.Errorf("Open() error = %v\nwant it to contain %q", err, want)
				}
			}
			if err != nil && strings.Contains(err.Error(), "NVML is not available") {
				t.Errorf("Open() error reports the skipped module: %v", err)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if tt.wantLog != "" && !strings.Contains(logs, tt.wantLog) {
				t.Errorf("logs do not contain %q:\n%s", tt.wantLog, logs)
			}
		})
	}
}

// TestOpenKeepsServingBesideABrokenFile: a .so that does not load (here a
// truncated file, as a half-finished upgrade leaves one) is a Failure of
// that file, its options are no error of their own, and the other modules
// start; options for a module that is nowhere fail the whole directory.
func TestOpenKeepsServingBesideABrokenFile(t *testing.T) {
	// The modules this process loaded stay where they are (Go refuses a
	// second copy of a plugin, and the loader a symbolic link): the broken
	// file goes beside them for this test.
	dir := modulesDir(t)
	broken := filepath.Join(dir, "broken.so")
	if err := os.WriteFile(broken, []byte("\x7fELF truncated"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(broken) })
	noNVML := "nvidia.nvml-library=" + filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	ctx := klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig()))
	plugins, failures := Open(ctx, dir, "node-a", []string{"simgpu.preset=t4x4", noNVML, "broken.edits=env"}, nil)
	defer func() { _ = Close(plugins) }()
	if len(plugins) != 1 || plugins[0].Module != "simgpu" {
		t.Errorf("started %v, want simgpu", plugins)
	}
	if len(failures) != 1 || failures[0].Module != "broken.so" || !errors.Is(failures[0], pluginload.ErrNotModule) {
		t.Fatalf("failures = %v, want one of broken.so wrapping ErrNotModule", failures)
	}
	if !strings.Contains(failures[0].Error(), broken) {
		t.Errorf("failure %q does not name the file", failures[0].Error())
	}

	none, failures := Open(ctx, dir, "node-a", []string{"simgpu.preset=t4x4", "simgpu2.x=y"}, nil)
	if len(none) != 0 || len(failures) != 1 || failures[0].Module != dir || !strings.Contains(failures[0].Error(), `module "simgpu2"`) {
		t.Errorf("options for a module nowhere: %v, %v; want one failure of the directory", none, failures)
	}
}
