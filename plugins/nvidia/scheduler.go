package nvidia

import (
	"errors"

	"github.com/kubegpu/kubegpu/plugins/gpulink"
	"github.com/kubegpu/kubegpu/types"
)

// ErrMIGShared is Admit's answer for a shared slice on a MIG device: a MIG
// device is already a fixed partition of its GPU, given out whole.
var ErrMIGShared = errors.New("a MIG device cannot be shared further; ask for whole devices")

// scheduler is the scheduler side: link weights and admission.
type scheduler struct{}

var _ types.SchedulerPlugin = scheduler{}

// Vendor is the vendor of the devices the node side publishes.
func (scheduler) Vendor() string { return Vendor }

// LinkWeight rates links as package gpulink does: NVLink, more links
// first, then NVSwitch, a PCIe switch, a host bridge, a cross-socket path.
func (scheduler) LinkWeight(l types.Link) int { return gpulink.Weight(l) }

// Admit refuses shared slices on MIG devices.
func (scheduler) Admit(d types.Device, r types.ContainerRequest) error {
	if d.Parent != "" && r.Shared() {
		return ErrMIGShared
	}
	return nil
}
