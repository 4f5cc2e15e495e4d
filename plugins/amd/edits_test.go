package amd

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// TestEdits: a container gets /dev/kfd and exactly its GPUs' render nodes;
// one without GPUs gets neither; a GPU the node does not have, or whose
// UUID is another's, is refused.
func TestEdits(t *testing.T) {
	topo, err := Discover(filepath.Join("testdata", "mi300x-8"))
	if err != nil {
		t.Fatal(err)
	}
	share := func(i int) types.DeviceShare {
		g := topo.GPUs[i]
		return types.DeviceShare{ID: g.ID, UUID: g.UUID, Exclusive: true, MemoryMiB: g.MemoryMiB, ComputePercent: 100}
	}
	e, err := topo.Edits(types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(3), share(1)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []types.DeviceNode{
		{HostPath: "/dev/kfd", ContainerPath: "/dev/kfd", Permissions: "rw"},
		{HostPath: "/dev/dri/renderD152", ContainerPath: "/dev/dri/renderD152", Permissions: "rw"},
		{HostPath: "/dev/dri/renderD136", ContainerPath: "/dev/dri/renderD136", Permissions: "rw"},
	}
	if !reflect.DeepEqual(e.DeviceNodes, want) || len(e.Env) != 0 || len(e.Mounts) != 0 || len(e.CDIDevices) != 0 {
		t.Errorf("edits %+v, want device nodes %+v and nothing else", e, want)
	}
	// A GPU named twice (two slices of it) is one render node.
	if e, err := topo.Edits(types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{share(1), share(1)}}); err != nil || !reflect.DeepEqual(e.DeviceNodes, []types.DeviceNode{want[0], want[2]}) {
		t.Errorf("amd1 twice: %+v, %v; want /dev/kfd and renderD136 once", e, err)
	}
	if e, err := topo.Edits(types.ContainerAllocation{Name: "c"}); err != nil || !reflect.DeepEqual(e, types.ContainerEdits{}) {
		t.Errorf("no devices: %+v, %v; want no edits", e, err)
	}
	wrongUUID := share(2)
	wrongUUID.UUID = topo.GPUs[3].UUID
	for _, d := range []types.DeviceShare{{ID: "amd8", UUID: "GPU-0"}, wrongUUID} {
		if _, err := topo.Edits(types.ContainerAllocation{Name: "c", Devices: []types.DeviceShare{d}}); !errors.Is(err, ErrNotOnNode) {
			t.Errorf("%+v: %v, want ErrNotOnNode", d, err)
		}
	}
}
