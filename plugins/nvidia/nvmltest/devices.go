package nvmltest

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func (m *Machine) isLost(g *GPU) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return g.lost
}

// index returns the index of the GPU behind an NVML device handle.
func (m *Machine) index(d nvml.Device) int {
	for i, g := range m.GPUs {
		if nvml.Device(g.Device) == d {
			return i
		}
	}
	panic(fmt.Sprintf("nvmltest: %T is not a GPU of this machine", d))
}

// lostOr returns ERROR_GPU_IS_LOST for a lost GPU, else ret.
func (g *GPU) lostOr(ret nvml.Return) nvml.Return {
	if g.machine.isLost(g) {
		return nvml.ERROR_GPU_IS_LOST
	}
	return ret
}

func (g *GPU) setMockFuncs() {
	d, m := g.Device, g.machine
	uuid, name, memory, cc, migMode := d.GetUUIDFunc, d.GetNameFunc, d.GetMemoryInfoFunc, d.GetCudaComputeCapabilityFunc, d.GetMigModeFunc
	d.GetUUIDFunc = func() (string, nvml.Return) {
		s, ret := uuid()
		return s, g.lostOr(ret)
	}
	d.GetNameFunc = func() (string, nvml.Return) {
		s, ret := name()
		return s, g.lostOr(ret)
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		mem, ret := memory()
		return mem, g.lostOr(ret)
	}
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) {
		major, minor, ret := cc()
		return major, minor, g.lostOr(ret)
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		cur, pending, ret := migMode()
		return cur, pending, g.lostOr(ret)
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return pciInfo(d.PciBusID), g.lostOr(nvml.SUCCESS)
	}
	// As documented for NVML, attributes are for MIG device handles only;
	// a whole GPU's SM count follows from its CUDA cores.
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{}, g.lostOr(nvml.ERROR_NOT_SUPPORTED)
	}
	d.GetNumGpuCoresFunc = func() (int, nvml.Return) {
		return g.SMs * 64, g.lostOr(nvml.SUCCESS)
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
		if !g.NUMAFromNVML {
			return 0, g.lostOr(nvml.ERROR_NOT_SUPPORTED)
		}
		return g.NUMANode, g.lostOr(nvml.SUCCESS)
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		switch {
		case len(g.NVLinks) == 0:
			return 0, g.lostOr(nvml.ERROR_NOT_SUPPORTED)
		case link >= len(g.NVLinks):
			return 0, g.lostOr(nvml.ERROR_INVALID_ARGUMENT)
		}
		return nvml.FEATURE_ENABLED, g.lostOr(nvml.SUCCESS)
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if link >= len(g.NVLinks) {
			return 0, g.lostOr(nvml.ERROR_INVALID_ARGUMENT)
		}
		if g.NVLinks[link].GPU < 0 {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, g.lostOr(nvml.SUCCESS)
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, g.lostOr(nvml.SUCCESS)
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		if link >= len(g.NVLinks) {
			return nvml.PciInfo{}, g.lostOr(nvml.ERROR_INVALID_ARGUMENT)
		}
		l := g.NVLinks[link]
		if l.GPU < 0 {
			return pciInfo(l.SwitchBusID), g.lostOr(nvml.SUCCESS)
		}
		return pciInfo(m.GPUs[l.GPU].PciBusID), g.lostOr(nvml.SUCCESS)
	}
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		return m.topology(d.Index, m.index(other)), g.lostOr(nvml.SUCCESS)
	}
	d.GetP2PStatusFunc = func(other nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		if caps != nvml.P2P_CAPS_INDEX_NVLINK {
			return nvml.P2P_STATUS_NOT_SUPPORTED, g.lostOr(nvml.SUCCESS)
		}
		o := m.GPUs[m.index(other)]
		if g.linksTo(o.Index) > 0 || (m.fabricManager && g.linksTo(-1) > 0 && o.linksTo(-1) > 0) {
			return nvml.P2P_STATUS_OK, g.lostOr(nvml.SUCCESS)
		}
		return nvml.P2P_STATUS_NOT_SUPPORTED, g.lostOr(nvml.SUCCESS)
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		return 7, g.lostOr(nvml.SUCCESS)
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < 0 || j >= len(g.MIGDevices) {
			return nil, g.lostOr(nvml.ERROR_NOT_FOUND)
		}
		return g.MIGDevices[j], g.lostOr(nvml.SUCCESS)
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return g.EventTypes, g.lostOr(nvml.SUCCESS)
	}
	d.RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
		if types&^g.EventTypes != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		g.registered |= types
		return nvml.SUCCESS
	}
}

// linksTo counts g's NVLinks to GPU gpu (-1: to NVSwitches).
func (g *GPU) linksTo(gpu int) int {
	n := 0
	for _, l := range g.NVLinks {
		if l.GPU == gpu {
			n++
		}
	}
	return n
}

func (md *MIGDevice) setMockFuncs(parent *GPU) {
	md.GetUUIDFunc = func() (string, nvml.Return) { return md.UUID, parent.lostOr(nvml.SUCCESS) }
	md.GetNameFunc = func() (string, nvml.Return) {
		return parent.Name + " MIG " + md.Profile, parent.lostOr(nvml.SUCCESS)
	}
	md.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: md.MemoryMB << 20}, parent.lostOr(nvml.SUCCESS)
	}
	md.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{MultiprocessorCount: md.SMs, MemorySizeMB: md.MemoryMB}, parent.lostOr(nvml.SUCCESS)
	}
	md.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(md.GI), parent.lostOr(nvml.SUCCESS) }
	md.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(md.CI), parent.lostOr(nvml.SUCCESS) }
	md.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	md.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent.Device, nvml.SUCCESS }
}

// pciInfo is the PciInfo NVML returns for a bus ID in its own form,
// "00000000:07:00.0".
func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(busID[i])
	}
	_, _ = fmt.Sscanf(busID, "%x:%x:%x.", &p.Domain, &p.Bus, &p.Device)
	return p
}
