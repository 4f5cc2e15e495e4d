package amd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// fixtureCopy copies a recorded tree to a directory the test may change,
// with a generation_id of 1.
func fixtureCopy(t *testing.T, name string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	setGeneration(t, root, "1")
	return root
}

func setGeneration(t *testing.T, root, g string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, TopologyDir, "generation_id"), []byte(g+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestNodePlugin: the node side serves the tree under its root, and builds
// a container's edits from the topology's current generation: a GPU whose
// render node moved (the driver reloaded) is given at its new node, one
// that went is refused.
func TestNodePlugin(t *testing.T) {
	ctx := context.Background()
	root := fixtureCopy(t, "mi300x-8")
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{OptionRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	inv, err := np.Discover(ctx)
	if err != nil || len(inv.Devices) != 8 {
		t.Fatalf("Discover: %d devices, %v", len(inv.Devices), err)
	}
	share := func(i int) types.DeviceShare {
		d := inv.Devices[i]
		return types.DeviceShare{ID: d.ID, UUID: d.UUID, Exclusive: true, MemoryMiB: d.MemoryMiB, ComputePercent: 100}
	}
	renderOf := func(e types.ContainerEdits) string { return e.DeviceNodes[len(e.DeviceNodes)-1].HostPath }

	e, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(0)}})
	if err != nil || renderOf(e) != "/dev/dri/renderD128" {
		t.Fatalf("amd0: %+v, %v", e, err)
	}

	// The driver reloads: amd0's render node is now 200.
	props := filepath.Join(root, TopologyDir, "nodes", "2", "properties")
	data, err := os.ReadFile(props)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(props, []byte(strings.Replace(string(data), "drm_render_minor 128", "drm_render_minor 200", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	setGeneration(t, root, "2")
	if e, err = np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(0)}}); err != nil || renderOf(e) != "/dev/dri/renderD200" {
		t.Errorf("amd0 after the reload: %+v, %v; want renderD200", e, err)
	}

	// amd7 goes.
	if err := os.RemoveAll(filepath.Join(root, TopologyDir, "nodes", "9")); err != nil {
		t.Fatal(err)
	}
	setGeneration(t, root, "3")
	if _, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(7)}}); !errors.Is(err, ErrNotOnNode) {
		t.Errorf("amd7 gone: %v, want ErrNotOnNode", err)
	}
}

// TestModuleOptions: unknown options and a relative root are refused; a
// root without the driver's topology is a node without devices.
func TestModuleOptions(t *testing.T) {
	ctx := context.Background()
	for opts, want := range map[string]map[string]string{
		"unknown option amd.colour (known: root, dev-root)": {"colour": "red"},
		"want an absolute directory":                        {OptionRoot: "testdata"},
	} {
		if _, err := NewModule().NodePlugin(ctx, types.PluginConfig{Options: want}); err == nil || !strings.Contains(err.Error(), opts) {
			t.Errorf("NodePlugin(%v) = %v, want %q", want, err, opts)
		}
	}
	if _, err := NewModule().NodePlugin(ctx, types.PluginConfig{Options: map[string]string{OptionRoot: t.TempDir()}}); !errors.Is(err, types.ErrNoDevices) {
		t.Errorf("no KFD topology: %v, want ErrNoDevices", err)
	}
	if _, err := NewModule().SchedulerPlugin(ctx, types.PluginConfig{Options: map[string]string{OptionRoot: "/"}}); err == nil || !strings.Contains(err.Error(), "takes no options") {
		t.Errorf("SchedulerPlugin with an option: %v", err)
	}
	sp, err := NewModule().SchedulerPlugin(ctx, types.PluginConfig{})
	if err != nil || sp.Vendor() != Vendor {
		t.Errorf("SchedulerPlugin: %v, %v", sp, err)
	}
}

// TestNodePluginDevRoot: with dev-root, a container's device nodes are
// found under it on the host and keep their paths in the container.
func TestNodePluginDevRoot(t *testing.T) {
	ctx := context.Background()
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{
		OptionRoot: fixtureCopy(t, "mi300x-8"), OptionDevRoot: "/run/devs/"}})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	inv, err := np.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := inv.Devices[1]
	e, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{{ID: d.ID, UUID: d.UUID, Exclusive: true}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []types.DeviceNode{{HostPath: "/run/devs/dev/kfd", ContainerPath: "/dev/kfd", Permissions: "rw"},
		{HostPath: "/run/devs/dev/dri/renderD136", ContainerPath: "/dev/dri/renderD136", Permissions: "rw"}}
	if !slices.Equal(e.DeviceNodes, want) {
		t.Errorf("edits %+v, want %+v", e.DeviceNodes, want)
	}
	if _, err := NewModule().NodePlugin(ctx, types.PluginConfig{Options: map[string]string{OptionDevRoot: "devs"}}); err == nil || !strings.Contains(err.Error(), "amd.dev-root=\"devs\": want an absolute directory") {
		t.Errorf("a relative dev-root: %v", err)
	}
}

// TestGuardedNodes: the shim guards /dev/kfd and every render node of the
// node's AMD GPUs, under dev-root on the host.
func TestGuardedNodes(t *testing.T) {
	ctx := context.Background()
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{
		OptionRoot: fixtureCopy(t, "mi300x-8"), OptionDevRoot: "/run/devs"}})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	got := np.(types.GuardedNodesPlugin).GuardedNodes()
	if len(got) != 9 || got[0] != (types.DeviceNode{HostPath: "/run/devs/dev/kfd", ContainerPath: "/dev/kfd"}) ||
		got[1] != (types.DeviceNode{HostPath: "/run/devs/dev/dri/renderD128", ContainerPath: "/dev/dri/renderD128"}) {
		t.Errorf("guarded nodes %+v, want /dev/kfd and 8 render nodes under /run/devs", got)
	}
}

// TestGuardedCardNodes: the shim also guards every DRM node sysfs lists
// for an AMD PCI device, card nodes among them (amdgpu takes commands on
// a card node too), and no other vendor's.
func TestGuardedCardNodes(t *testing.T) {
	ctx := context.Background()
	root := fixtureCopy(t, "mi300x-8")
	for name, id := range map[string]string{"card1": "1002:74A1", "renderD200": "1002:74A1", "card0": "1A03:2000", "card1-DP-1": "1002:74A1"} {
		dir := filepath.Join(root, "sys/class/drm", name, "device")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "uevent"), []byte("DRIVER=x\nPCI_ID="+id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{OptionRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range np.(types.GuardedNodesPlugin).GuardedNodes() {
		got = append(got, g.ContainerPath)
	}
	for _, want := range []string{"/dev/kfd", "/dev/dri/renderD128", "/dev/dri/card1", "/dev/dri/renderD200"} {
		if !slices.Contains(got, want) {
			t.Errorf("guarded %v, want %s among them", got, want)
		}
	}
	if slices.Contains(got, "/dev/dri/card0") || slices.Contains(got, "/dev/dri/card1-DP-1") {
		t.Errorf("guarded %v: another vendor's card or a connector", got)
	}
}
