package amd

import (
	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/types"
)

// NewScheduler is the AMD module's scheduler side: it rates the paths
// between AMD GPUs as every GPU module does (package gpulink: a direct
// XGMI link by its bandwidth, as NVLink by its links), and admits what the
// engine checks itself.
func NewScheduler() types.SchedulerPlugin { return gpulink.Scheduler{Of: Vendor} }
