package nvidia

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/plugins/nvidia/nvmllib"
	"github.com/kubegpu/kubegpu/types"
)

// envHardware turns TestHardware on: on a node with NVIDIA GPUs and their
// driver, KUBEGPU_NVML_HARDWARE=1 go test -run TestHardware ./plugins/nvidia/
// checks the module against the real libnvidia-ml (make test-nvidia-hardware).
// Without it the test is skipped: CI has no GPUs.
const envHardware = "KUBEGPU_NVML_HARDWARE"

// TestHardware starts the module's node side on the real driver, as the
// shim does, and checks what it discovers against nvidia-smi, the edits it
// gives a container, the health watcher and, where the node has
// nvidia-cuda-mps-control, a per-container MPS daemon started and stopped.
func TestHardware(t *testing.T) {
	if os.Getenv(envHardware) != "1" {
		t.Skipf("set %s=1 on a node with NVIDIA GPUs to check the module against its driver", envHardware)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	start := time.Now()
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "hardware", Options: map[string]string{}})
	if err != nil {
		t.Fatalf("NodePlugin: %v", err)
	}
	defer func() {
		if err := np.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	t.Logf("started (NVML init, discovery, health watcher) in %v", time.Since(start).Round(time.Millisecond))
	t.Logf("the driver's per-cgroup memory limits (%s): %v", DriverMemoryLimits, nvmllib.Has(DriverMemoryLimits))

	inv, err := np.Discover(ctx)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if err := inv.Validate(); err != nil {
		t.Fatalf("inventory does not validate: %v", err)
	}
	if len(inv.Devices) == 0 {
		t.Fatal("no devices discovered")
	}
	js, _ := json.MarshalIndent(inv, "", "  ")
	t.Logf("inventory:\n%s", js)

	var gpus []types.Device
	for _, d := range inv.Devices {
		if d.Parent == "" {
			gpus = append(gpus, d)
		}
		if d.Health != types.Healthy {
			t.Errorf("device %s is %s at start", d.ID, d.Health)
		}
		if d.MemoryMiB <= 0 || d.Model == "" || d.ComputeCapability == "" {
			t.Errorf("device %s: memory %d MiB, model %q, compute capability %q: want all set", d.ID, d.MemoryMiB, d.Model, d.ComputeCapability)
		}
	}
	checkAgainstSMI(t, gpus)

	// Discovery is cheap and stable: the same IDs and UUIDs every time.
	start = time.Now()
	again, err := np.Discover(ctx)
	if err != nil {
		t.Fatalf("second Discover: %v", err)
	}
	t.Logf("rediscovered in %v", time.Since(start).Round(time.Microsecond))
	if got, want := deviceKeys(again), deviceKeys(inv); !slices.Equal(got, want) {
		t.Errorf("second discovery found %v, first %v", got, want)
	}

	// Edits: a whole device by its CDI name (the default), nothing
	// visible without devices, a device that is not on the node refused.
	// The device is the first one given out whole: a GPU not in MIG mode,
	// or a MIG device.
	i := slices.IndexFunc(inv.Devices, func(d types.Device) bool {
		return !slices.ContainsFunc(inv.Devices, func(c types.Device) bool { return c.Parent == d.ID })
	})
	if i < 0 {
		t.Fatal("no device to give out: every GPU is a MIG parent without MIG devices")
	}
	g := inv.Devices[i]
	whole := types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: g.ID, UUID: g.UUID, Exclusive: true, MemoryMiB: g.MemoryMiB, ComputePercent: types.MaxComputePercent}}}
	e, err := np.ContainerEdits(ctx, whole)
	if err != nil {
		t.Fatalf("edits for a whole GPU: %v", err)
	}
	if want := []string{"nvidia.com/gpu=" + g.UUID}; !slices.Equal(e.CDIDevices, want) {
		t.Errorf("CDI devices for a whole GPU: %v, want %v", e.CDIDevices, want)
	}
	if v := envValue(e.Env, EnvVisibleDevices); v != "void" {
		t.Errorf("%s=%q for a whole GPU with CDI edits, want void", EnvVisibleDevices, v)
	}
	none, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "main"})
	if err != nil || envValue(none.Env, EnvVisibleDevices) != "void" || len(none.CDIDevices) != 0 {
		t.Errorf("edits without devices: %+v, %v; want %s=void and no CDI devices", none, err, EnvVisibleDevices)
	}
	forged := whole
	forged.Devices = []types.DeviceShare{{ID: g.ID, UUID: "GPU-00000000-0000-0000-0000-000000000000", Exclusive: true}}
	if _, err := np.ContainerEdits(ctx, forged); !errors.Is(err, ErrNotOnNode) {
		t.Errorf("edits for a UUID not on the node: %v, want %v", err, ErrNotOnNode)
	}

	// The health watcher runs against the driver's events without
	// reporting a healthy GPU unhealthy.
	time.Sleep(5 * time.Second)
	later, err := np.Discover(ctx)
	if err != nil {
		t.Fatalf("Discover after 5 s: %v", err)
	}
	for _, d := range later.Devices {
		if d.Health != types.Healthy {
			t.Errorf("device %s became %s with no XID", d.ID, d.Health)
		}
	}

	if g.Parent != "" {
		t.Log("the first device is a MIG device, which cannot be shared: MPS not checked")
		return
	}
	checkMPS(ctx, t, g)
}

// checkAgainstSMI compares the discovered GPUs with nvidia-smi's list.
func checkAgainstSMI(t *testing.T, gpus []types.Device) {
	t.Helper()
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Log("nvidia-smi not found: discovery not compared with it")
		return
	}
	out, err := exec.Command(smi, "--query-gpu=index,uuid,pci.bus_id,memory.total,name", "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(gpus) {
		t.Errorf("nvidia-smi lists %d GPUs, the module %d", len(lines), len(gpus))
	}
	for _, line := range lines {
		f := strings.Split(line, ", ")
		if len(f) != 5 {
			t.Fatalf("nvidia-smi line %q: want 5 fields", line)
		}
		index, _ := strconv.Atoi(f[0])
		mem, _ := strconv.ParseInt(f[3], 10, 64)
		i := slices.IndexFunc(gpus, func(d types.Device) bool { return d.UUID == f[1] })
		if i < 0 {
			t.Errorf("nvidia-smi's GPU %s was not discovered", f[1])
			continue
		}
		d := gpus[i]
		bus, err := normalizeBusID(f[2])
		if err != nil {
			t.Errorf("nvidia-smi bus ID %q: %v", f[2], err)
		}
		t.Logf("GPU %s matches nvidia-smi: index %d, bus %s, %d MiB, %s", d.UUID, index, bus, mem, f[4])
		if d.Index != index || d.PCIBusID != bus || d.MemoryMiB != mem || d.Model != f[4] {
			t.Errorf("GPU %s: module index %d, bus %s, %d MiB, %q; nvidia-smi %d, %s, %d MiB, %q",
				d.UUID, d.Index, d.PCIBusID, d.MemoryMiB, d.Model, index, bus, mem, f[4])
		}
	}
}

// checkMPS starts a second node side with MPS on, gives a container a
// quarter of g, and checks that its MPS daemon answers and is stopped once
// the pod is gone.
func checkMPS(ctx context.Context, t *testing.T, g types.Device) {
	t.Helper()
	if _, err := exec.LookPath(DefaultMPSControl); err != nil {
		t.Logf("%s not found: MPS not checked", DefaultMPSControl)
		return
	}
	if os.Geteuid() != 0 {
		t.Log("not root (the MPS directories are tmpfs mounts): MPS not checked")
		return
	}
	root := filepath.Join(t.TempDir(), "mps")
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "hardware", Options: map[string]string{
		OptionMPS: "true", OptionMPSRoot: root, OptionHealthChecks: "false",
	}})
	if err != nil {
		t.Fatalf("NodePlugin with MPS: %v", err)
	}
	defer func() {
		if err := np.Close(); err != nil {
			t.Errorf("Close with MPS: %v", err)
		}
	}()
	pp, ok := np.(types.PodScopedPlugin)
	if !ok {
		t.Fatal("node side with MPS is not pod-scoped")
	}
	// Whatever fails below, the test's daemon is stopped and its tmpfs
	// mounts undone before TempDir goes (t.Context is done before
	// cleanups run): a list taken a minute from now leaves every pod of
	// this root out.
	defer func() {
		_ = pp.ReleasePods(context.WithoutCancel(ctx), nil, time.Now().Add(time.Minute))
	}()
	slice := types.ContainerAllocation{Name: "main", Devices: []types.DeviceShare{{ID: g.ID, UUID: g.UUID, MemoryMiB: g.MemoryMiB / 4, ComputePercent: 25}}}
	start := time.Now()
	e, err := pp.PodContainerEdits(ctx, "pod-1", slice)
	if err != nil {
		t.Fatalf("edits for an MPS slice: %v", err)
	}
	t.Logf("MPS daemon for a 25%% slice ready in %v; edits %+v", time.Since(start).Round(time.Millisecond), e)
	if v := envValue(e.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); v == "" {
		t.Errorf("MPS slice edits set no CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: %+v", e.Env)
	}
	var pipe string
	for _, m := range e.Mounts {
		if m.ContainerPath == MPSContainerPipeDir {
			pipe = m.HostPath
		}
	}
	if pipe == "" {
		t.Fatalf("MPS slice edits mount no pipe directory at %s: %+v", MPSContainerPipeDir, e.Mounts)
	}
	entries, err := os.ReadDir(pipe)
	if err != nil || len(entries) == 0 {
		t.Errorf("MPS daemon's pipe directory %s: %d entries, %v; want its pipes", pipe, len(entries), err)
	}
	// The daemon answers on its pipe with the container's limits.
	out, err := mpsQuery(ctx, pipe, "get_default_active_thread_percentage")
	if got, perr := strconv.ParseFloat(out, 64); err != nil || perr != nil || got != 25 {
		t.Errorf("get_default_active_thread_percentage through the container's pipe: %q, %v; want 25", out, err)
	} else {
		t.Logf("get_default_active_thread_percentage through the container's pipe: %s", out)
	}
	// Real CUDA clients in slices of their own: the limits hold.
	checkSliceLimits(ctx, t, pp, g, root)

	// The daemon this container got, by its record (PID and start time),
	// not by name: the node may run other containers' daemons.
	r, ok := readRecord(filepath.Dir(pipe))
	if !ok {
		t.Fatalf("no MPS record in %s", filepath.Dir(pipe))
	}
	mine := func() bool { return (&mpsDaemons{}).alive(r) }
	if !mine() {
		t.Errorf("the container's MPS daemon (PID %d) is not running while its slice is live", r.PID)
	}
	// A pod is released once a sandbox list taken a second after its
	// directory was made leaves it out.
	time.Sleep(1100 * time.Millisecond)
	if err := pp.ReleasePods(ctx, map[string]bool{}, time.Now()); err != nil {
		t.Fatalf("ReleasePods: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for mine() {
		if time.Now().After(deadline) {
			t.Errorf("the container's MPS daemon (PID %d) still runs 10 s after its pod was released", r.PID)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Dir(pipe)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released container's MPS directory %s: %v, want it removed", filepath.Dir(pipe), err)
	}
}

// mpsQuery sends cmd to the MPS control daemon whose pipe directory is
// pipe and returns its answer.
func mpsQuery(ctx context.Context, pipe, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q := exec.CommandContext(ctx, DefaultMPSControl)
	q.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipe)
	q.Stdin = strings.NewReader(cmd + "\n")
	out, err := q.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func deviceKeys(inv types.Inventory) []string {
	var keys []string
	for _, d := range inv.Devices {
		keys = append(keys, d.ID+"="+d.UUID)
	}
	return keys
}

func envValue(env []types.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
