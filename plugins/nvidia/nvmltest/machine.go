package nvmltest

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// AllInstances is the GPU and compute instance ID of an event that concerns
// a whole GPU rather than one of its MIG devices.
const AllInstances = 0xFFFFFFFF

// Machine is a mock NVML server: go-nvml's dgxa100 mock with what that mock
// leaves out (PCI bus IDs, NUMA nodes, SM counts, PCIe topology, NVLinks, MIG
// devices, events) filled in by its builder methods. Builders change the
// machine in place and return it, for chaining; call them before the machine
// is used. Inject* and SetLost may be called at any time.
type Machine struct {
	*dgxa100.Server
	// GPUs are the machine's GPUs, by NVML index.
	GPUs []*GPU

	// topology is the PCIe common ancestor of two GPUs (indexes).
	topology func(a, b int) nvml.GpuTopologyLevel
	// fabricManager says whether NVLink peer-to-peer works through the
	// NVSwitches (it needs nvidia-fabricmanager).
	fabricManager bool

	mu      sync.Mutex
	events  chan nvml.EventData
	waitErr nvml.Return
	freed   bool
}

// GPU is one mocked GPU.
type GPU struct {
	*dgxa100.Device
	// NUMANode is the GPU's NUMA node; NVML reports it when
	// NUMAFromNVML is true.
	NUMANode     int
	NUMAFromNVML bool
	// SMs is the number of streaming multiprocessors.
	SMs int
	// NVLinks are the GPU's NVLinks, by link index.
	NVLinks []NVLink
	// MIGDevices are the MIG devices, by MIG device index.
	MIGDevices []*MIGDevice
	// EventTypes are the event types the GPU supports.
	EventTypes uint64

	machine    *Machine
	lost       bool
	registered uint64
}

// NVLink is one NVLink of a GPU: to another GPU, or to an NVSwitch.
type NVLink struct {
	// GPU is the index of the GPU at the far end, or -1 for an NVSwitch.
	GPU int
	// SwitchBusID is the NVSwitch's PCI bus ID when GPU is -1.
	SwitchBusID string
}

// MIGDevice is one mocked MIG device: a mock device handle for a compute
// instance created through the dgxa100 mock's MIG machinery.
type MIGDevice struct {
	*mock.Device
	UUID    string
	Profile string
	// GI and CI are the GPU and compute instance IDs.
	GI, CI   uint32
	MemoryMB uint64
	SMs      uint32
}

// dgxBusIDs are the PCI buses of a DGX A100's eight GPUs, in NVML's form.
var dgxBusIDs = [8]string{
	"00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0",
	"00000000:87:00.0", "00000000:90:00.0", "00000000:B7:00.0", "00000000:BD:00.0",
}

// NewDGXA100 returns a DGX A100: eight A100-SXM4-40GB GPUs with fixed UUIDs,
// four PCIe switches with two GPUs each, two CPU sockets, and twelve NVLinks
// per GPU to six NVSwitches (all-to-all, with the fabric manager running).
func NewDGXA100() *Machine {
	m := &Machine{
		Server:        dgxa100.New(),
		topology:      dgxPCIe,
		fabricManager: true,
		events:        make(chan nvml.EventData, 64),
	}
	for i, d := range m.Devices {
		dev := d.(*dgxa100.Device)
		dev.UUID = fmt.Sprintf("GPU-a100a100-%04x-4000-8000-%012x", i, i)
		dev.Name = "NVIDIA A100-SXM4-40GB"
		dev.PciBusID = dgxBusIDs[i]
		g := &GPU{Device: dev, NUMANode: i / 4, NUMAFromNVML: true, SMs: 108, machine: m,
			EventTypes: nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError}
		for l := 0; l < 12; l++ {
			g.NVLinks = append(g.NVLinks, NVLink{GPU: -1, SwitchBusID: fmt.Sprintf("00000000:%02X:00.0", 0xC4+l/2)})
		}
		g.setMockFuncs()
		m.GPUs = append(m.GPUs, g)
	}
	m.setMockFuncs()
	return m
}

// dgxNVLinks is the DGX-1 (V100) hybrid cube-mesh: {a, b, links}.
var dgxNVLinks = [][3]int{
	{0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 5, 2}, {2, 3, 2}, {4, 7, 2}, {5, 6, 2}, {6, 7, 2},
	{0, 1, 1}, {0, 2, 1}, {1, 3, 1}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {5, 7, 1},
}

// NewDGX1 returns a DGX-1: the DGX A100's PCIe layout with eight
// Tesla V100-SXM2-16GB GPUs joined by the DGX-1 hybrid cube-mesh of six
// NVLinks per GPU (one or two between a pair), without NVSwitches.
func NewDGX1() *Machine {
	m := NewDGXA100().WithModel("Tesla V100-SXM2-16GB", 16160, 80, 7, 0)
	for _, g := range m.GPUs {
		g.NVLinks = nil
	}
	for _, l := range dgxNVLinks {
		for k := 0; k < l[2]; k++ {
			m.GPUs[l[0]].NVLinks = append(m.GPUs[l[0]].NVLinks, NVLink{GPU: l[1]})
			m.GPUs[l[1]].NVLinks = append(m.GPUs[l[1]].NVLinks, NVLink{GPU: l[0]})
		}
	}
	return m
}

// dgxPCIe is the DGX PCIe layout: GPUs 2k and 2k+1 share a PCIe switch,
// GPUs 0-3 and 4-7 a CPU socket.
func dgxPCIe(a, b int) nvml.GpuTopologyLevel {
	switch {
	case a/2 == b/2:
		return nvml.TOPOLOGY_SINGLE
	case a/4 == b/4:
		return nvml.TOPOLOGY_NODE
	default:
		return nvml.TOPOLOGY_SYSTEM
	}
}

// WithModel gives every GPU another product name, memory (MiB), SM count and
// compute capability.
func (m *Machine) WithModel(name string, memoryMiB uint64, sms, ccMajor, ccMinor int) *Machine {
	for _, g := range m.GPUs {
		g.Name = name
		g.MemoryInfo = nvml.Memory{Total: memoryMiB << 20}
		g.SMs = sms
		g.CudaComputeCapability = dgxa100.CudaComputeCapability{Major: ccMajor, Minor: ccMinor}
	}
	return m
}

// WithoutNVLink removes every NVLink: a PCIe-only machine, whose GPUs
// answer NVLink queries with ERROR_NOT_SUPPORTED.
func (m *Machine) WithoutNVLink() *Machine {
	for _, g := range m.GPUs {
		g.NVLinks = nil
	}
	return m
}

// WithoutFabricManager makes NVLink peer-to-peer through the NVSwitches
// unavailable, as on an NVSwitch system whose fabric manager is not running.
func (m *Machine) WithoutFabricManager() *Machine {
	m.fabricManager = false
	return m
}

// WithPCIeTopology replaces the PCIe layout: level(a, b) is the common
// ancestor of GPUs a and b.
func (m *Machine) WithPCIeTopology(level func(a, b int) nvml.GpuTopologyLevel) *Machine {
	m.topology = level
	return m
}

// WithNUMAFromSysfs makes NVML answer NUMA queries with ERROR_NOT_SUPPORTED,
// as older drivers do, so that the NUMA node must come from sysfs.
func (m *Machine) WithNUMAFromSysfs() *Machine {
	for _, g := range m.GPUs {
		g.NUMAFromNVML = false
	}
	return m
}

// WithInitError makes Init fail with ret.
func (m *Machine) WithInitError(ret nvml.Return) *Machine {
	m.InitFunc = func() nvml.Return { return ret }
	return m
}

// WithEventTypes sets the event types GPU gpu supports (0: none).
func (m *Machine) WithEventTypes(gpu int, types uint64) *Machine {
	m.GPUs[gpu].EventTypes = types
	return m
}

// migProfile is a MIG profile of the dgxa100 mock.
type migProfile struct {
	gi, ci int
}

// migProfiles are the A100-40GB MIG profiles, by nvidia-smi's names.
var migProfiles = map[string]migProfile{
	"1g.5gb":    {nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	"1g.5gb+me": {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	"1g.10gb":   {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	"2g.10gb":   {nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE},
	"3g.20gb":   {nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE},
	"4g.20gb":   {nvml.GPU_INSTANCE_PROFILE_4_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE},
	"7g.40gb":   {nvml.GPU_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE},
}

// WithMIG turns MIG mode on for GPU gpu and creates one MIG device (a GPU
// instance with one full compute instance) per profile, e.g. "3g.20gb",
// "2g.10gb", "1g.5gb". With no profiles the GPU is in MIG mode without MIG
// devices. It panics on an unknown profile.
func (m *Machine) WithMIG(gpu int, profiles ...string) *Machine {
	g := m.GPUs[gpu]
	if ret, _ := g.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		panic(fmt.Sprintf("SetMigMode: %v", ret))
	}
	for _, name := range profiles {
		p, ok := migProfiles[name]
		if !ok {
			panic(fmt.Sprintf("nvmltest: unknown MIG profile %q", name))
		}
		giInfo, ret := g.GetGpuInstanceProfileInfo(p.gi)
		if ret != nvml.SUCCESS {
			panic(fmt.Sprintf("GetGpuInstanceProfileInfo(%s): %v", name, ret))
		}
		gi, ret := g.CreateGpuInstance(&giInfo)
		if ret != nvml.SUCCESS {
			panic(fmt.Sprintf("CreateGpuInstance(%s): %v", name, ret))
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(p.ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			panic(fmt.Sprintf("GetComputeInstanceProfileInfo(%s): %v", name, ret))
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			panic(fmt.Sprintf("CreateComputeInstance(%s): %v", name, ret))
		}
		giID := gi.(*dgxa100.GpuInstance).Info.Id
		ciID := ci.(*dgxa100.ComputeInstance).Info.Id
		j := len(g.MIGDevices)
		md := &MIGDevice{
			Device:   &mock.Device{},
			UUID:     fmt.Sprintf("MIG-a100a100-%04x-4000-8000-%012x", gpu, j),
			Profile:  name,
			GI:       giID,
			CI:       ciID,
			MemoryMB: giInfo.MemorySizeMB,
			SMs:      ciInfo.MultiprocessorCount,
		}
		md.setMockFuncs(g)
		g.MIGDevices = append(g.MIGDevices, md)
	}
	return m
}

// SetLost makes every query of GPU gpu fail with ERROR_GPU_IS_LOST, as when
// a GPU falls off the bus (XID 79), or makes it answer again.
func (m *Machine) SetLost(gpu int, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.GPUs[gpu].lost = lost
}

// Registered returns the event types the code under test registered for
// on GPU gpu.
func (m *Machine) Registered(gpu int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.GPUs[gpu].registered
}

// InjectXID delivers a critical XID error event for GPU gpu, as NVML does,
// if the code under test registered for XID events on that GPU. It reports
// whether the event was delivered.
func (m *Machine) InjectXID(gpu int, xid uint64) bool {
	return m.inject(gpu, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: AllInstances, ComputeInstanceId: AllInstances})
}

// InjectMIGXID delivers a critical XID error event for MIG device mig of GPU
// gpu (an event that names its GPU and compute instance).
func (m *Machine) InjectMIGXID(gpu, mig int, xid uint64) bool {
	md := m.GPUs[gpu].MIGDevices[mig]
	return m.inject(gpu, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: md.GI, ComputeInstanceId: md.CI})
}

// InjectEvent delivers an event of any type for GPU gpu.
func (m *Machine) InjectEvent(gpu int, e nvml.EventData) bool { return m.inject(gpu, e) }

func (m *Machine) inject(gpu int, e nvml.EventData) bool {
	m.mu.Lock()
	g := m.GPUs[gpu]
	registered := g.registered&e.EventType != 0
	m.mu.Unlock()
	if !registered {
		return false
	}
	e.Device = g.Device
	m.events <- e
	return true
}

// FailWait makes every wait on an event set fail with ret (SUCCESS: wait
// normally again).
func (m *Machine) FailWait(ret nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waitErr = ret
}

// EventSetFreed reports whether the code under test freed its event set.
func (m *Machine) EventSetFreed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.freed
}

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

func (m *Machine) setMockFuncs() {
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		set := &mock.EventSet{}
		set.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			m.mu.Lock()
			ret := m.waitErr
			m.mu.Unlock()
			if ret != nvml.SUCCESS {
				return nvml.EventData{}, ret
			}
			select {
			case e := <-m.events:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		}
		set.FreeFunc = func() nvml.Return {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.freed = true
			return nvml.SUCCESS
		}
		return set, nvml.SUCCESS
	}
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
