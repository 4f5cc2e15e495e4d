package rewrite

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/types"
)

func TestStrip(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{
		Devices: []*runtimeapi.Device{
			{HostPath: "/dev/nvidia0", ContainerPath: "/dev/nvidia0"},
			{HostPath: "/dev/fuse", ContainerPath: "/dev/nvidia-uvm"}, // a GPU path in the container
			{HostPath: "/dev//nvidiactl", ContainerPath: "/dev/ctl"},
			{HostPath: "/dev/fuse", ContainerPath: "/dev/fuse"},
		},
		Mounts: []*runtimeapi.Mount{
			{HostPath: "/dev/nvidia-caps/nvidia-cap1", ContainerPath: "/caps"},
			{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/GPU-1"},
			{HostPath: "/dev/null", ContainerPath: "/run/nvidia-container-devices/../nvidia-container-devices/all"},
			{HostPath: "/data", ContainerPath: "/data"},
			{HostPath: "/dev", ContainerPath: "/host/dev"}, // masked if privileged, see Masks
		},
		CDIDevices: []*runtimeapi.CDIDevice{{Name: "nvidia.com/gpu=all"}, {Name: "k8s.gpu.nvidia.com/device=gpu-0"}, {Name: "kubegpu.io/simgpu=gpu1"},
			{Name: "example.com/nic=eth1"}, {Name: "NVIDIA.COM/gpu=0"}},
		Annotations: map[string]string{
			"cdi.k8s.io/dra":   "nvidia.com/gpu=0,example.com/nic=eth2",
			"cdi.k8s.io/other": "kubegpu.io/simgpu=gpu0",
			"keep":             "nvidia.com/gpu=0",
		},
	}
	s := Strip(cfg, nil, nil)
	var left []string
	for _, d := range cfg.Devices {
		left = append(left, d.HostPath+":"+d.ContainerPath)
	}
	for _, m := range cfg.Mounts {
		left = append(left, m.HostPath+":"+m.ContainerPath)
	}
	for _, d := range cfg.CDIDevices {
		left = append(left, d.Name)
	}
	want := []string{"/dev/fuse:/dev/fuse", "/data:/data", "/dev:/host/dev", "example.com/nic=eth1"}
	if !reflect.DeepEqual(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
	if want := map[string]string{"cdi.k8s.io/dra": "example.com/nic=eth2", "keep": "nvidia.com/gpu=0"}; !reflect.DeepEqual(cfg.Annotations, want) {
		t.Errorf("annotations %v, want %v", cfg.Annotations, want)
	}
	if len(s.DeviceNodes) != 3 || len(s.Mounts) != 3 || len(s.CDIDevices) != 6 {
		t.Errorf("stripped %+v", s)
	}
	if !Strip(cfg, nil, nil).Empty() {
		t.Error("a second Strip removed more")
	}
}

func TestMasks(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{Mounts: []*runtimeapi.Mount{
		{HostPath: "/dev", ContainerPath: "/host/dev"},
		{HostPath: "/", ContainerPath: "/rootfs"},
		{HostPath: "/dev/nvidia-caps", ContainerPath: "/caps"},
		{HostPath: "/data", ContainerPath: "/data"},
	}}
	var got []string
	for _, m := range Masks(cfg, []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1"}) {
		if m.HostPath != MaskSource || !m.Readonly {
			t.Errorf("mask %v: want %s read-only", m, MaskSource)
		}
		got = append(got, m.ContainerPath)
	}
	want := []string{"/dev/nvidia0", "/host/dev/nvidia0", "/rootfs/dev/nvidia0",
		"/dev/nvidia-caps/nvidia-cap1", "/host/dev/nvidia-caps/nvidia-cap1", "/rootfs/dev/nvidia-caps/nvidia-cap1", "/caps/nvidia-cap1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("masks %q, want %q", got, want)
	}
}

func TestHostGPUNodes(t *testing.T) {
	dev := t.TempDir()
	for _, f := range []string{"nvidia0", "nvidiactl", "nvidia-uvm", "null", "nvidia-caps/nvidia-cap1"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dev, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dev, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := HostGPUNodes(dev)
	slices.Sort(got)
	want := []string{"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HostGPUNodes = %q, want %q", got, want)
	}
	if got := HostGPUNodes(filepath.Join(dev, "none")); len(got) != 0 {
		t.Errorf("no driver: %q", got)
	}
}

// TestStripDevicesReachingGPUs: a device entry whose host path is a
// directory holding an NVIDIA character device (which the runtime expands
// to every device in it), a link to one, or such a device under another
// name, is removed; other devices stay.
func TestStripDevicesReachingGPUs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating device nodes needs root")
	}
	dir := t.TempDir()
	gpu := filepath.Join(dir, "devs", "renamed-gpu")
	if err := os.MkdirAll(filepath.Dir(gpu), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(gpu, syscall.S_IFCHR|0o600, int(unix.Mkdev(nvidiaMajor, 251))); err != nil {
		t.Skipf("mknod: %v", err)
	}
	null := filepath.Join(dir, "null")
	if err := syscall.Mknod(null, syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Dir(gpu), link); err != nil {
		t.Fatal(err)
	}
	cfg := &runtimeapi.ContainerConfig{Devices: []*runtimeapi.Device{
		{HostPath: gpu, ContainerPath: "/dev/x"},
		{HostPath: filepath.Dir(gpu), ContainerPath: "/devs"},
		{HostPath: link, ContainerPath: "/linked"},
		{HostPath: null, ContainerPath: "/dev/mynull"},
	}}
	s := Strip(cfg, nil, nil)
	if len(cfg.Devices) != 1 || cfg.Devices[0].HostPath != null || len(s.DeviceNodes) != 3 {
		t.Errorf("left %v, removed %v: want only %s left", cfg.Devices, s.DeviceNodes, null)
	}
}

// TestStripGuardedNodes: the device nodes a module guards are removed
// under any name (their host path, their container path, a link to them,
// a directory that holds them), with the module's CDI devices; other
// devices stay.
func TestStripGuardedNodes(t *testing.T) {
	dir := t.TempDir()
	devs := filepath.Join(dir, "dev", "dri")
	if err := os.MkdirAll(devs, 0o755); err != nil {
		t.Fatal(err)
	}
	// A stand-in for a render node: a link to a real character device.
	link := filepath.Join(dir, "render-link")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	guarded := []types.DeviceNode{
		{HostPath: "/dev/null", ContainerPath: "/dev/dri/renderD128"},
		{HostPath: filepath.Join(devs, "renderD136"), ContainerPath: "/dev/dri/renderD136"},
		{HostPath: "/nonexistent/kfd", ContainerPath: "/dev/kfd"},
	}
	cfg := &runtimeapi.ContainerConfig{
		Devices: []*runtimeapi.Device{
			{HostPath: "/dev/null", ContainerPath: "/dev/gpu"},
			{HostPath: "/dev/fuse", ContainerPath: "/dev/kfd"},
			{HostPath: link, ContainerPath: "/dev/x"},
			{HostPath: filepath.Join(dir, "dev"), ContainerPath: "/dev/all"},
			{HostPath: "/dev/fuse", ContainerPath: "/dev/fuse"},
		},
		Mounts: []*runtimeapi.Mount{{HostPath: filepath.Join(devs, "renderD136"), ContainerPath: "/r"}, {HostPath: "/data", ContainerPath: "/data"}},
		CDIDevices: []*runtimeapi.CDIDevice{{Name: "amd.com/gpu=all"}, {Name: "gpu.amd.com/gpu=0"}, {Name: "example.com/nic=eth1"},
			{Name: "intel.com/gpu=card1"}, {Name: "gpu.intel.com/gpu=0"}, {Name: "intel.com/qat=qat0"}},
	}
	s := Strip(cfg, nil, guarded)
	var left []string
	for _, d := range cfg.Devices {
		left = append(left, d.HostPath+":"+d.ContainerPath)
	}
	for _, m := range cfg.Mounts {
		left = append(left, m.HostPath+":"+m.ContainerPath)
	}
	for _, d := range cfg.CDIDevices {
		left = append(left, d.Name)
	}
	if want := []string{"/dev/fuse:/dev/fuse", "/data:/data", "example.com/nic=eth1", "intel.com/qat=qat0"}; !reflect.DeepEqual(left, want) {
		t.Errorf("left %q, want %q (stripped %+v)", left, want, s)
	}
}
