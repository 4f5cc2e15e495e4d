package intel

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// TestNodePlugin: a container gets exactly its GPUs' card and render
// nodes, under dev-root on the host; the shim guards every Intel GPU's;
// a GPU the node does not have (or of another UUID) is refused.
func TestNodePlugin(t *testing.T) {
	ctx := context.Background()
	np, err := NewModule().NodePlugin(ctx, types.PluginConfig{NodeName: "n", Options: map[string]string{
		OptionRoot: copyTree(t, "max1550-4"), OptionDevRoot: "/run/devs"}})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	inv, err := np.Discover(ctx)
	if err != nil || len(inv.Devices) != 4 {
		t.Fatalf("Discover: %d devices, %v", len(inv.Devices), err)
	}
	share := func(i int) types.DeviceShare {
		return types.DeviceShare{ID: inv.Devices[i].ID, UUID: inv.Devices[i].UUID, Exclusive: true}
	}
	e, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(1), share(3), share(1)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []types.DeviceNode{
		{HostPath: "/run/devs/dev/dri/card2", ContainerPath: "/dev/dri/card2", Permissions: "rw"},
		{HostPath: "/run/devs/dev/dri/renderD129", ContainerPath: "/dev/dri/renderD129", Permissions: "rw"},
		{HostPath: "/run/devs/dev/dri/card4", ContainerPath: "/dev/dri/card4", Permissions: "rw"},
		{HostPath: "/run/devs/dev/dri/renderD131", ContainerPath: "/dev/dri/renderD131", Permissions: "rw"},
	}
	if !slices.Equal(e.DeviceNodes, want) || len(e.Env)+len(e.Mounts)+len(e.CDIDevices) > 0 {
		t.Errorf("edits %+v, want %+v", e, want)
	}
	if e, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c"}); err != nil || len(e.DeviceNodes) > 0 {
		t.Errorf("no devices: %+v, %v; want no edits", e, err)
	}
	for _, d := range []types.DeviceShare{{ID: "intel9", UUID: inv.Devices[0].UUID}, {ID: "intel0", UUID: "GPU-intel-0000000000000000"}} {
		if _, err := np.ContainerEdits(ctx, types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{d}}); !errors.Is(err, ErrNotOnNode) {
			t.Errorf("%+v: %v, want ErrNotOnNode", d, err)
		}
	}
	guarded := np.(types.GuardedNodesPlugin).GuardedNodes()
	if len(guarded) != 8 || guarded[0] != (types.DeviceNode{HostPath: "/run/devs/dev/dri/card1", ContainerPath: "/dev/dri/card1"}) {
		t.Errorf("guarded %+v, want the 4 GPUs' card and render nodes", guarded)
	}
	for _, g := range guarded {
		if strings.HasSuffix(g.ContainerPath, "/card0") {
			t.Errorf("the BMC's card0 is guarded: %+v", g)
		}
	}
}

// TestModuleOptions: options are checked; the scheduler side takes none.
func TestModuleOptions(t *testing.T) {
	ctx := context.Background()
	for want, opts := range map[string]map[string]string{
		"unknown option intel.colour (known: root, dev-root)": {"colour": "red"},
		"intel.root=\"testdata\": want an absolute directory": {OptionRoot: "testdata"},
	} {
		if _, err := NewModule().NodePlugin(ctx, types.PluginConfig{Options: opts}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NodePlugin(%v) = %v, want %q", opts, err, want)
		}
	}
	if _, err := NewModule().SchedulerPlugin(ctx, types.PluginConfig{Options: map[string]string{OptionRoot: "/"}}); err == nil {
		t.Error("the scheduler side took a node option")
	}
	sp, err := NewModule().SchedulerPlugin(ctx, types.PluginConfig{})
	if err != nil || sp.Vendor() != Vendor {
		t.Errorf("SchedulerPlugin: %v, %v", sp, err)
	}
}

// TestGuardedSkippedCard: a card the module does not serve (bound to
// vfio-pci here) is still guarded: a container reaches it only through
// the shim.
func TestGuardedSkippedCard(t *testing.T) {
	root := copyTree(t, "max1550-4")
	write(t, root, "card2/device/uevent", "DRIVER=vfio-pci\nPCI_CLASS=38000\nPCI_ID=8086:0BD5\nPCI_SLOT_NAME=0000:42:00.0\n")
	np, err := NewModule().NodePlugin(context.Background(), types.PluginConfig{NodeName: "n", Options: map[string]string{OptionRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range np.(types.GuardedNodesPlugin).GuardedNodes() {
		got = append(got, g.ContainerPath)
	}
	if !slices.Contains(got, "/dev/dri/card2") {
		t.Errorf("guarded %v, want the vfio-bound card2 among them", got)
	}
}
