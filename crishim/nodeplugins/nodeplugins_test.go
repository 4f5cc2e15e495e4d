package nodeplugins

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

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
			plugins, err := Open(ctx, dir, "node-a", tt.options, nil)
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
