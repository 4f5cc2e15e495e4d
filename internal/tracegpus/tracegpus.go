// Package tracegpus gives the nodes of a GPU cluster trace simulated GPUs
// (plugins/simgpu) for the placement simulator (device-scheduler/sim): the
// simgpu preset of a node's model where there is one, else GPUs of 16 GiB
// on two NUMA nodes. kubegpu-sim, the simulator's tests and the trace
// replay (test/replay) share it, so that they place pods on the same GPUs.
package tracegpus

import (
	"context"
	"fmt"
	"strings"

	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// Topology is the simulated GPUs of a trace's node of the given model and
// GPU count.
func Topology(model string, gpus int) simgpu.Topology {
	if preset, err := simgpu.Preset(strings.ToLower(model)); err == nil {
		return preset.WithGPUs(gpus)
	}
	return simgpu.Topology{Name: model, Model: model, GPUs: gpus, MemoryMiB: 16384, NUMANodes: min(2, gpus), GPUsPerPCIeSwitch: min(2, gpus)}
}

// Inventory is the device inventory of node, a trace's node of the given
// model and GPU count.
func Inventory(node, model string, gpus int) types.Inventory {
	return simgpu.Inventory(Topology(model, gpus), node)
}

// Plugins returns the scheduler side of the simulated GPUs' module, for the
// allocation engine.
func Plugins() ([]types.SchedulerPlugin, error) {
	sp, err := simgpu.NewModule().SchedulerPlugin(context.Background(), types.PluginConfig{})
	if err != nil {
		return nil, fmt.Errorf("simgpu scheduler plugin: %w", err)
	}
	return []types.SchedulerPlugin{sp}, nil
}
