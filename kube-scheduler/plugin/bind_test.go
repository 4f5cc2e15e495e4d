package plugin

import (
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

func TestDevicesOf(t *testing.T) {
	a := types.PodAllocation{
		Node:           "n",
		InitContainers: []types.ContainerAllocation{{Name: "setup", Devices: []types.DeviceShare{{ID: "2"}}}},
		Containers: []types.ContainerAllocation{
			{Name: "train", Devices: []types.DeviceShare{{ID: "0"}, {ID: "1"}}},
			{Name: "sidecar"},
		},
	}
	if got, want := devicesOf(a), "init:setup=2 train=0,1"; got != want {
		t.Errorf("devicesOf = %q, want %q", got, want)
	}
	if got := devicesOf(types.PodAllocation{}); got != "" {
		t.Errorf("devicesOf(empty) = %q, want empty", got)
	}
}
