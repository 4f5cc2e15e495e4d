// Package gpulink rates the paths between GPUs for the allocation engine. It
// is shared by the GPU device modules (NVIDIA, AMD and simulated) so that
// all rank interconnects the same way: NVLink, more links first, or a direct
// XGMI link, more bandwidth first; then NVSwitch; XGMI over more than one
// hop; a shared PCIe switch, a host bridge, and last a path across CPU
// sockets.
package gpulink

import "github.com/kubegpu/kubegpu/types"

// Weights of each kind of path, on the scale 0..types.MaxLinkWeight.
const (
	WeightCrossSocket = 0
	WeightHostBridge  = 10
	WeightPCIeSwitch  = 30
	WeightNVSwitch    = 60
	// WeightNVLinkBase is the weight of a single NVLink; each further link
	// adds WeightPerNVLink, up to types.MaxLinkWeight.
	WeightNVLinkBase = 70
	WeightPerNVLink  = 10
	// WeightXGMIDirect is the weight of a direct XGMI link of
	// XGMILinkMBps or less (or of unknown bandwidth); each further
	// XGMILinkMBps adds WeightPerNVLink, up to types.MaxLinkWeight.
	// WeightXGMIHops is the weight of GPUs of one hive more than one XGMI
	// hop apart.
	WeightXGMIDirect = WeightNVLinkBase
	WeightXGMIHops   = 40
	// XGMILinkMBps is one XGMI link's bandwidth on AMD Instinct MI200
	// (50 GB/s, as rocm-smi --shownodesbw reports a single link).
	XGMILinkMBps = 50000
)

// Weight rates the path l. It is pure and does not allocate.
func Weight(l types.Link) int {
	switch l.Kind {
	case types.LinkNVLink:
		n := l.Count
		if n < 1 {
			n = 1
		}
		return min(WeightNVLinkBase+(n-1)*WeightPerNVLink, types.MaxLinkWeight)
	case types.LinkXGMI:
		if l.Hops > 1 {
			return WeightXGMIHops
		}
		extra := int(max(0, (l.BandwidthMBps-1)/XGMILinkMBps))
		return min(WeightXGMIDirect+extra*WeightPerNVLink, types.MaxLinkWeight)
	case types.LinkNVSwitch:
		return WeightNVSwitch
	case types.LinkPCIeSwitch:
		return WeightPCIeSwitch
	case types.LinkHostBridge:
		return WeightHostBridge
	default:
		return WeightCrossSocket
	}
}

// Scheduler is the scheduler side of a GPU module whose devices need
// nothing beyond the engine's own checks (AMD's, Intel's): it rates the
// paths between the vendor's GPUs with Weight, and admits every request
// the engine lets through, whole GPUs and slices alike (slices stay best
// effort: nothing on the node holds such a GPU's slice to its grant).
type Scheduler struct {
	// Of is the Device.Vendor whose devices it rates.
	Of string
}

var _ types.SchedulerPlugin = Scheduler{}

// Vendor is Of.
func (s Scheduler) Vendor() string { return s.Of }

// LinkWeight rates l with Weight.
func (Scheduler) LinkWeight(l types.Link) int { return Weight(l) }

// Admit admits every request.
func (Scheduler) Admit(types.Device, types.ContainerRequest) error { return nil }
