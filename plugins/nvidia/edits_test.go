package nvidia

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmltest"
	"github.com/kubegpu/kubegpu/types"
)

func TestContainerEdits(t *testing.T) {
	m := nvmltest.NewDGXA100().WithMIG(3, "3g.20gb", "3g.20gb")
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	inv := discover(t, np)
	share := func(id string, exclusive bool, memMiB int64, percent int) types.DeviceShare {
		d, ok := inv.DeviceByID(id)
		if !ok {
			t.Fatalf("no device %s", id)
		}
		return types.DeviceShare{ID: id, UUID: d.UUID, Exclusive: exclusive, MemoryMiB: memMiB, ComputePercent: percent}
	}
	whole := func(id string) types.DeviceShare { return share(id, true, 40960, 100) }
	u := func(id string) string { return share(id, true, 0, 0).UUID }
	mps := config{mps: true}
	// The container's MPS daemon, as mpsDaemons would start it.
	start := func([]string, mpsLimits) (mpsDirs, error) {
		return mpsDirs{pipe: "/run/kubegpu/mps/uid/c/pipe", shm: "/run/kubegpu/mps/uid/c/shm"}, nil
	}

	tests := []struct {
		name    string
		cfg     config
		devices []types.DeviceShare
		want    types.ContainerEdits
		wantErr string
	}{
		{
			name: "no devices hides every GPU",
			want: types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}}},
		},
		{
			name: "no devices hides every GPU with cdi",
			cfg:  config{cdi: true},
			want: types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}}},
		},
		{
			name:    "whole gpus by uuid, in allocation order",
			devices: []types.DeviceShare{whole("gpu5"), whole("gpu1")},
			want:    types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: u("gpu5") + "," + u("gpu1")}}},
		},
		{
			name:    "mig device by uuid",
			devices: []types.DeviceShare{share("gpu3-mig1", true, 19968, 100)},
			want:    types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: u("gpu3-mig1")}}},
		},
		{
			name:    "cdi uuid names",
			cfg:     config{cdi: true},
			devices: []types.DeviceShare{whole("gpu5"), share("gpu3-mig1", true, 19968, 100)},
			want: types.ContainerEdits{
				CDIDevices: []string{"nvidia.com/gpu=" + u("gpu5"), "nvidia.com/gpu=" + u("gpu3-mig1")},
				Env:        []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}},
			},
		},
		{
			name:    "cdi index names",
			cfg:     config{cdi: true, cdiByIndex: true},
			devices: []types.DeviceShare{whole("gpu5"), share("gpu3-mig1", true, 19968, 100)},
			want: types.ContainerEdits{
				CDIDevices: []string{"nvidia.com/gpu=5", "nvidia.com/gpu=3:1"},
				Env:        []types.EnvVar{{Name: EnvVisibleDevices, Value: "void"}},
			},
		},
		{
			name:    "shared slice without mps",
			devices: []types.DeviceShare{share("gpu2", false, 4096, 30)},
			want: types.ContainerEdits{Env: []types.EnvVar{
				{Name: EnvVisibleDevices, Value: u("gpu2")},
				{Name: EnvMemoryMiB, Value: "4096"},
				{Name: EnvCores, Value: "30"},
			}},
		},
		{
			name:    "whole gpu on an mps node",
			cfg:     mps,
			devices: []types.DeviceShare{whole("gpu2")},
			want:    types.ContainerEdits{Env: []types.EnvVar{{Name: EnvVisibleDevices, Value: u("gpu2")}}},
		},
		{
			// Ordinals follow the PCI bus order: gpu1 (0000:0f) is
			// ordinal 0, gpu6 (0000:b7) ordinal 1.
			name:    "shared slices with mps",
			cfg:     mps,
			devices: []types.DeviceShare{share("gpu6", false, 8192, 25), share("gpu1", false, 2048, 25)},
			want: types.ContainerEdits{
				Env: []types.EnvVar{
					{Name: EnvVisibleDevices, Value: u("gpu6") + "," + u("gpu1")},
					{Name: EnvMemoryMiB, Value: "8192,2048"},
					{Name: EnvCores, Value: "25,25"},
					{Name: EnvMPSPipeDirectory, Value: MPSContainerPipeDir},
					{Name: EnvMPSThreadPercentage, Value: "25"},
					{Name: EnvCUDADeviceOrder, Value: "PCI_BUS_ID"},
					{Name: EnvMPSPinnedMemoryLimit, Value: "0=2048M,1=8192M"},
				},
				Mounts: []types.Mount{
					{HostPath: "/run/kubegpu/mps/uid/c/pipe", ContainerPath: MPSContainerPipeDir, ReadOnly: true},
					{HostPath: "/run/kubegpu/mps/uid/c/shm", ContainerPath: "/dev/shm"},
				},
			},
		},
		{
			name:    "mps without a memory amount",
			cfg:     config{mps: true, cdi: true},
			devices: []types.DeviceShare{share("gpu0", false, 0, 50)},
			want: types.ContainerEdits{
				CDIDevices: []string{"nvidia.com/gpu=" + u("gpu0")},
				Env: []types.EnvVar{
					{Name: EnvVisibleDevices, Value: "void"},
					{Name: EnvMemoryMiB, Value: "0"},
					{Name: EnvCores, Value: "50"},
					{Name: EnvMPSPipeDirectory, Value: MPSContainerPipeDir},
					{Name: EnvMPSThreadPercentage, Value: "50"},
					{Name: EnvCUDADeviceOrder, Value: "PCI_BUS_ID"},
				},
				Mounts: []types.Mount{
					{HostPath: "/run/kubegpu/mps/uid/c/pipe", ContainerPath: MPSContainerPipeDir, ReadOnly: true},
					{HostPath: "/run/kubegpu/mps/uid/c/shm", ContainerPath: "/dev/shm"},
				},
			},
		},
		{
			name:    "mps with unequal compute shares",
			cfg:     mps,
			devices: []types.DeviceShare{share("gpu0", false, 1024, 30), share("gpu1", false, 1024, 40)},
			wantErr: "MPS takes one compute share per container, got 30% and 40%",
		},
		{
			name:    "mps with memory only: no compute limit",
			cfg:     config{mps: true, cdi: true},
			devices: []types.DeviceShare{share("gpu0", false, 1024, 0)},
			want: types.ContainerEdits{
				CDIDevices: []string{"nvidia.com/gpu=" + u("gpu0")},
				Env: []types.EnvVar{
					{Name: EnvVisibleDevices, Value: "void"},
					{Name: EnvMemoryMiB, Value: "1024"},
					{Name: EnvCores, Value: "0"},
					{Name: EnvMPSPipeDirectory, Value: MPSContainerPipeDir},
					{Name: EnvMPSThreadPercentage, Value: "100"},
					{Name: EnvCUDADeviceOrder, Value: "PCI_BUS_ID"},
					{Name: EnvMPSPinnedMemoryLimit, Value: "0=1024M"},
				},
				Mounts: []types.Mount{
					{HostPath: "/run/kubegpu/mps/uid/c/pipe", ContainerPath: MPSContainerPipeDir, ReadOnly: true},
					{HostPath: "/run/kubegpu/mps/uid/c/shm", ContainerPath: "/dev/shm"},
				},
			},
		},
		{
			name:    "mps with whole and shared gpus",
			cfg:     mps,
			devices: []types.DeviceShare{whole("gpu0"), share("gpu1", false, 1024, 40)},
			wantErr: "both whole and shared GPUs",
		},
		{
			name:    "unknown device",
			devices: []types.DeviceShare{{ID: "gpu9", UUID: "GPU-x", Exclusive: true}},
			wantErr: "device is not on this node: gpu9 (GPU-x)",
		},
		{
			name:    "uuid of another gpu",
			devices: []types.DeviceShare{{ID: "gpu1", UUID: u("gpu2"), Exclusive: true}},
			wantErr: "device is not on this node: gpu1",
		},
		{
			name:    "twice",
			devices: []types.DeviceShare{whole("gpu1"), whole("gpu1")},
			wantErr: "device gpu1 is allocated twice",
		},
		{
			name:    "gpu in mig mode",
			devices: []types.DeviceShare{whole("gpu3")},
			wantErr: "GPU gpu3 is in MIG mode: it is given out only through its MIG devices",
		},
		{
			name:    "shared mig device",
			devices: []types.DeviceShare{share("gpu3-mig0", false, 1024, 10)},
			wantErr: "MIG device gpu3-mig0 cannot be shared",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			np.cfg = tt.cfg
			got, err := np.edits(types.ContainerAllocation{Name: "c", Devices: tt.devices}, start)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), `nvidia: container "c": `) {
					t.Fatalf("ContainerEdits() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ContainerEdits() error = %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ContainerEdits() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// TestMPSNeedsThePod: MPS slices get a daemon of the container's own, so
// edits without the pod are refused; the daemon serves the container's GPUs
// in PCI bus order.
func TestMPSNeedsThePod(t *testing.T) {
	m := nvmltest.NewDGXA100()
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	np.cfg.mps = true
	slices := []types.DeviceShare{{ID: "gpu6", UUID: m.GPUs[6].UUID, MemoryMiB: 1024, ComputePercent: 20}, {ID: "gpu1", UUID: m.GPUs[1].UUID, MemoryMiB: 1024, ComputePercent: 20}}
	if _, err := np.ContainerEdits(t.Context(), types.ContainerAllocation{Name: "c", Devices: slices}); err == nil || !strings.Contains(err.Error(), "MPS slices need the container's pod") {
		t.Errorf("ContainerEdits of MPS slices without the pod: %v", err)
	}
	var started []string
	var limits mpsLimits
	slices[0].MemoryMiB = 4096
	if _, err := np.edits(types.ContainerAllocation{Name: "c", Devices: slices}, func(uuids []string, l mpsLimits) (mpsDirs, error) {
		started, limits = uuids, l
		return mpsDirs{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{m.GPUs[1].UUID, m.GPUs[6].UUID}; !reflect.DeepEqual(started, want) {
		t.Errorf("daemon for %v, want %v (PCI bus order)", started, want)
	}
	// The daemon's defaults are the container's limits, ordinals in PCI order.
	if want := (mpsLimits{ThreadPercent: 20, PinnedMemory: "0=1024M,1=4096M"}); limits != want {
		t.Errorf("daemon limits %+v, want %+v", limits, want)
	}
}

func TestContainerEditsFollowDiscovery(t *testing.T) {
	m := nvmltest.NewDGXA100()
	np := startNode(t, m, map[string]string{OptionHealthChecks: "false"})
	gpu7 := types.DeviceShare{ID: "gpu7", UUID: m.GPUs[7].UUID, Exclusive: true}
	if _, err := np.ContainerEdits(t.Context(), types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{gpu7}}); err != nil {
		t.Fatalf("ContainerEdits(gpu7) error = %v", err)
	}
	// gpu7 is replaced by another board: a new UUID at the same index.
	m.GPUs[7].UUID = "GPU-replaced"
	discover(t, np)
	_, err := np.ContainerEdits(t.Context(), types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{gpu7}})
	if !errors.Is(err, ErrNotOnNode) {
		t.Errorf("ContainerEdits(old gpu7) error = %v, want ErrNotOnNode", err)
	}
}
