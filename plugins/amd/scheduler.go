package amd

import (
	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/types"
)

// Scheduler is the AMD module's scheduler side: it rates the paths between
// AMD GPUs as every GPU module does (package gpulink: a direct XGMI link by
// its bandwidth, as NVLink by its links), and admits what the engine
// checks itself.
type Scheduler struct{}

var _ types.SchedulerPlugin = Scheduler{}

// Vendor is Vendor.
func (Scheduler) Vendor() string { return Vendor }

// LinkWeight rates l with gpulink.Weight.
func (Scheduler) LinkWeight(l types.Link) int { return gpulink.Weight(l) }

// Admit admits every request the engine lets through: whole GPUs and
// slices alike (slices stay best effort: nothing on the node holds an AMD
// GPU's slice to its grant).
func (Scheduler) Admit(types.Device, types.ContainerRequest) error { return nil }
