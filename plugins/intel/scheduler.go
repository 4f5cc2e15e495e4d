package intel

import (
	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/types"
)

// NewScheduler is the Intel module's scheduler side: it rates the paths
// between Intel GPUs as every GPU module does (package gpulink), and
// admits what the engine checks itself.
func NewScheduler() types.SchedulerPlugin { return gpulink.Scheduler{Of: Vendor} }
