package nvidia

import (
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

func TestNoNVML(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	tests := []struct {
		name string
		mod  types.Module
		opts map[string]string
		want string
	}{
		{
			name: "library missing",
			mod:  NewModule(),
			opts: map[string]string{OptionNVMLLibrary: missing},
			want: "nvidia: NVML is not available on this node: NVML library not found: " + missing +
				": cannot open shared object file: No such file or directory; install the NVIDIA driver, or set nvidia.nvml-library to libnvidia-ml's path",
		},
		{
			name: "init finds no library",
			mod:  NewModuleWithNVML(nvmltest.NewDGXA100().WithInitError(nvml.ERROR_LIBRARY_NOT_FOUND)),
			want: "nvidia: NVML is not available on this node: libnvidia-ml.so.1 not found; install the NVIDIA driver, or set nvidia.nvml-library to libnvidia-ml's path: ERROR_LIBRARY_NOT_FOUND",
		},
		{
			name: "driver not loaded",
			mod:  NewModuleWithNVML(nvmltest.NewDGXA100().WithInitError(nvml.ERROR_DRIVER_NOT_LOADED)),
			want: "nvidia: NVML is not available on this node: the NVIDIA kernel driver is not loaded (is the nvidia module loaded and /dev/nvidiactl present?): ERROR_DRIVER_NOT_LOADED",
		},
		{
			name: "no permission",
			mod:  NewModuleWithNVML(nvmltest.NewDGXA100().WithInitError(nvml.ERROR_NO_PERMISSION)),
			want: "no permission to use the GPUs",
		},
		{
			name: "driver mismatch",
			mod:  NewModuleWithNVML(nvmltest.NewDGXA100().WithInitError(nvml.ERROR_LIB_RM_VERSION_MISMATCH)),
			want: "does not match the loaded kernel driver",
		},
		{
			name: "other",
			mod:  NewModuleWithNVML(nvmltest.NewDGXA100().WithInitError(nvml.ERROR_UNKNOWN)),
			want: "nvidia: NVML is not available on this node: initialize NVML: ERROR_UNKNOWN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.mod.NodePlugin(t.Context(), types.PluginConfig{NodeName: "n", Options: tt.opts})
			if !errors.Is(err, ErrNoNVML) || !errors.Is(err, types.ErrNoDevices) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NodePlugin() error = %v\nwant ErrNoNVML, types.ErrNoDevices and %q", err, tt.want)
			}
		})
	}
}

func TestNodeOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    map[string]string
		want    config
		wantErr string
	}{
		{
			name: "defaults",
			want: config{cdi: true, mpsRoot: DefaultMPSRoot, mpsControl: DefaultMPSControl, mpsShmMiB: DefaultMPSShmMiB, healthChecks: true, library: "libnvidia-ml.so.1",
				ignoredXIDs: map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}},
		},
		{
			name: "everything",
			opts: map[string]string{OptionEdits: "cdi", OptionCDIDeviceNames: "index", OptionMPS: "true",
				OptionMPSRoot: "/var/run/mps", OptionMPSControl: "/opt/bin/nvidia-cuda-mps-control", OptionMPSShmMiB: "256", OptionIgnoreXIDs: "79, 48",
				OptionNVMLLibrary: "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"},
			want: config{cdi: true, cdiByIndex: true, mps: true, mpsRoot: "/var/run/mps", mpsControl: "/opt/bin/nvidia-cuda-mps-control", mpsShmMiB: 256,
				healthChecks: true, ignoredXIDs: map[uint64]bool{48: true, 79: true}, library: "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"},
		},
		{
			name: "no health checks",
			opts: map[string]string{OptionHealthChecks: "false", OptionEdits: "env", OptionMPS: "false"},
			want: config{mpsRoot: DefaultMPSRoot, mpsControl: DefaultMPSControl, mpsShmMiB: DefaultMPSShmMiB, library: "libnvidia-ml.so.1",
				ignoredXIDs: map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}},
		},
		{name: "unknown", opts: map[string]string{"edit": "cdi"}, wantErr: "unknown option nvidia.edit (known: edits, cdi-device-names, mps, mps-root, mps-control, mps-shm-mib, health-checks, ignore-xids, nvml-library)"},
		{name: "bad edits", opts: map[string]string{OptionEdits: "CDI"}, wantErr: `option nvidia.edits must be env or cdi, got "CDI"`},
		{name: "names without cdi", opts: map[string]string{OptionEdits: "env", OptionCDIDeviceNames: "uuid"}, wantErr: "option nvidia.cdi-device-names needs nvidia.edits=cdi"},
		{name: "bad names", opts: map[string]string{OptionEdits: "cdi", OptionCDIDeviceNames: "type-index"}, wantErr: "must be uuid or index"},
		{name: "bad mps", opts: map[string]string{OptionMPS: "yes please"}, wantErr: `option nvidia.mps must be true or false, got "yes please"`},
		{name: "root without mps", opts: map[string]string{OptionMPSRoot: "/run/mps"}, wantErr: "option nvidia.mps-root needs nvidia.mps=true"},
		{name: "relative root", opts: map[string]string{OptionMPS: "true", OptionMPSRoot: "run/mps"}, wantErr: "must be a clean absolute path"},
		{name: "unclean root", opts: map[string]string{OptionMPS: "true", OptionMPSRoot: "/run/../mps"}, wantErr: "must be a clean absolute path"},
		{name: "removed pipe dir", opts: map[string]string{OptionMPS: "true", "mps-pipe-dir": "/tmp/nvidia-mps"}, wantErr: "option nvidia.mps-pipe-dir was removed: each container with MPS slices now gets an MPS daemon of its own"},
		{name: "bad health checks", opts: map[string]string{OptionHealthChecks: "sometimes"}, wantErr: "option nvidia.health-checks must be true or false"},
		{name: "xids without health checks", opts: map[string]string{OptionHealthChecks: "false", OptionIgnoreXIDs: "79"}, wantErr: "has no effect with nvidia.health-checks=false"},
		{name: "bad xids", opts: map[string]string{OptionIgnoreXIDs: "13;31"}, wantErr: `option nvidia.ignore-xids: invalid XID list "13;31": "13;31" is not an XID`},
		{name: "empty library", opts: map[string]string{OptionNVMLLibrary: ""}, wantErr: "option nvidia.nvml-library must be the path of libnvidia-ml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseNodeOptions(tt.opts)
			if errors.Is(err, types.ErrNoDevices) {
				t.Errorf("option error %v says there are no devices", err)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseNodeOptions() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseNodeOptions() error = %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseNodeOptions() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
	// The module reports option errors as its own, before touching NVML.
	m := nvmltest.NewDGXA100()
	if _, err := NewModuleWithNVML(m).NodePlugin(t.Context(), types.PluginConfig{Options: map[string]string{"mps": "x"}}); err == nil ||
		!strings.HasPrefix(err.Error(), "nvidia: option nvidia.mps") || len(m.InitCalls()) != 0 {
		t.Errorf("NodePlugin(bad option) error = %v, NVML inits %d", err, len(m.InitCalls()))
	}
	if _, err := NewModuleWithNVML(m).NodePlugin(t.Context(), types.PluginConfig{Options: map[string]string{OptionNVMLLibrary: "/x.so"}}); err == nil ||
		!strings.Contains(err.Error(), "built on a given NVML") {
		t.Errorf("NodePlugin(nvml-library) on an injected NVML: error = %v", err)
	}
}

func TestParseXIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint64
		wantErr string
	}{
		{in: "default", want: []uint64{13, 31, 43, 45, 68, 109}},
		{in: "default,94, 13", want: []uint64{13, 31, 43, 45, 68, 94, 109}},
		{in: "79", want: []uint64{79}},
		{in: " 48 ,79,48", want: []uint64{48, 79}},
		{in: "none", want: []uint64{}},
		{in: " none ", want: []uint64{}},
		{in: "65535", want: []uint64{65535}},
		{in: "", wantErr: "empty entry"},
		{in: "13,", wantErr: "empty entry"},
		{in: "none,13", wantErr: "none must stand alone"},
		{in: "0", wantErr: `"0" is not an XID`},
		{in: "65536", wantErr: `"65536" is not an XID`},
		{in: "-1", wantErr: "is not an XID"},
		{in: "0x4f", wantErr: "is not an XID"},
		{in: "Default", wantErr: "is not an XID"},
	}
	for _, tt := range tests {
		got, err := ParseXIDs(tt.in)
		if tt.wantErr != "" {
			if !errors.Is(err, ErrInvalidXIDs) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseXIDs(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseXIDs(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if s := FormatXIDs(DefaultIgnoredXIDs); s != "13,31,43,45,68,109" {
		t.Errorf("FormatXIDs(default) = %q", s)
	}
}

func FuzzParseXIDs(f *testing.F) {
	for _, s := range []string{"default", "default,94", "none", "13, 31", "", ",", "0", "65535", "none,1", "1e3", "+5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		xids, err := ParseXIDs(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidXIDs) {
				t.Fatalf("ParseXIDs(%q) error %v does not wrap ErrInvalidXIDs", s, err)
			}
			return
		}
		if !slices.IsSorted(xids) || len(slices.Compact(slices.Clone(xids))) != len(xids) {
			t.Fatalf("ParseXIDs(%q) = %v, not sorted and unique", s, xids)
		}
		for _, x := range xids {
			if x < 1 || x > MaxXID {
				t.Fatalf("ParseXIDs(%q) = %v, out of range", s, xids)
			}
		}
		again, err := ParseXIDs(FormatXIDs(xids))
		if err != nil || !slices.Equal(again, xids) {
			t.Fatalf("ParseXIDs(FormatXIDs(%v)) = %v, %v", xids, again, err)
		}
	})
}

func TestSchedulerPlugin(t *testing.T) {
	sp, err := NewModule().SchedulerPlugin(t.Context(), types.PluginConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Vendor() != types.VendorNVIDIA {
		t.Errorf("Vendor() = %q, want %q, the node side's", sp.Vendor(), types.VendorNVIDIA)
	}
	for _, l := range []types.Link{
		{Kind: types.LinkNVLink, Count: 12}, {Kind: types.LinkNVLink, Count: 2}, {Kind: types.LinkNVLink, Count: 1},
		{Kind: types.LinkNVSwitch}, {Kind: types.LinkPCIeSwitch}, {Kind: types.LinkHostBridge}, {Kind: types.LinkCrossSocket},
	} {
		if got, want := sp.LinkWeight(l), gpulink.Weight(l); got != want {
			t.Errorf("LinkWeight(%s) = %d, want gpulink's %d", l.Label(), got, want)
		}
	}
	gpu := types.Device{ID: "gpu0"}
	mig := types.Device{ID: "gpu0-mig0", Parent: "gpu0"}
	tests := []struct {
		name string
		d    types.Device
		r    types.ContainerRequest
		want error
	}{
		{"whole gpu, whole request", gpu, types.ContainerRequest{Count: 2}, nil},
		{"whole gpu, slice", gpu, types.ContainerRequest{Count: 1, MemoryMiB: 1024}, nil},
		{"mig device, whole request", mig, types.ContainerRequest{Count: 1}, nil},
		{"mig device, memory slice", mig, types.ContainerRequest{Count: 1, MemoryMiB: 1024}, ErrMIGShared},
		{"mig device, compute slice", mig, types.ContainerRequest{Count: 1, ComputePercent: 50}, ErrMIGShared},
	}
	for _, tt := range tests {
		if got := sp.Admit(tt.d, tt.r); !errors.Is(got, tt.want) {
			t.Errorf("%s: Admit() = %v, want %v", tt.name, got, tt.want)
		}
	}
	if _, err := NewModule().SchedulerPlugin(t.Context(), types.PluginConfig{Options: map[string]string{"edits": "cdi"}}); err == nil ||
		!strings.Contains(err.Error(), "the scheduler side takes no options") {
		t.Errorf("SchedulerPlugin(options) error = %v", err)
	}
	if NewModule().Name() != "nvidia" {
		t.Errorf("Name() = %q", NewModule().Name())
	}
}
