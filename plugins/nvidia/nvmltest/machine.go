package nvmltest

import (
	"fmt"
	"sync"

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
