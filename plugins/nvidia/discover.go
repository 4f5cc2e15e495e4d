package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/types"
)

// Discover lists the GPUs and MIG devices NVML reports, with their health
// and the links between the GPUs. Links are measured once per pair of
// GPUs and cached; the rest is read from NVML on every call (a few NVML
// queries per device).
func (n *node) Discover(ctx context.Context) (types.Inventory, error) {
	n.discoverMu.Lock()
	defer n.discoverMu.Unlock()
	logger := klog.FromContext(ctx)

	gpus, answering, err := n.scan(ctx)
	if err != nil {
		return types.Inventory{}, err
	}
	links, err := n.linksBetween(ctx, gpus)
	if err != nil {
		return types.Inventory{}, err
	}

	n.mu.RLock()
	h := n.health
	n.mu.RUnlock()
	inv := types.Inventory{Links: links}
	devices := make(map[string]deviceEntry)
	for _, g := range gpus {
		d := g.dev
		if g.lost {
			d.Health = types.Unhealthy
		} else if _, sick := h.unhealthy(d.UUID, AllInstances, AllInstances); sick {
			d.Health = types.Unhealthy
		}
		if n.mps != nil && !g.migEnabled {
			// MIG devices are never shared: their partition is the limit.
			d.SliceEnforcer = types.EnforcerMPS
		}
		inv.Devices = append(inv.Devices, d)
		devices[d.ID] = deviceEntry{dev: d, migIndex: -1, parent: g.migEnabled}
		for _, m := range g.migs {
			md := m.dev
			if _, sick := h.unhealthy(d.UUID, m.gi, m.ci); sick || d.Health == types.Unhealthy {
				md.Health = types.Unhealthy
			}
			inv.Devices = append(inv.Devices, md)
			devices[md.ID] = deviceEntry{dev: md, migIndex: m.index}
		}
	}
	if err := inv.Validate(); err != nil {
		return types.Inventory{}, fmt.Errorf("discover: %w", err)
	}
	n.mu.Lock()
	n.devices, n.answering = devices, answering
	n.mu.Unlock()
	if logger.V(5).Enabled() {
		logger.V(5).Info("Discovered NVIDIA devices", "inventory", inv)
	}
	return inv, nil
}

// scan reads every GPU NVML lists. It returns the GPUs to advertise, and
// those that answer NVML (advertised or not).
func (n *node) scan(ctx context.Context) (gpus, answering []gpuRecord, err error) {
	logger := klog.FromContext(ctx)
	count, ret := n.lib.DeviceGetCount()
	if err := nvmlError("count GPUs", ret); err != nil {
		return nil, nil, fmt.Errorf("discover: %w", err)
	}
	known := make(map[int]gpuRecord, count)
	for i := 0; i < count; i++ {
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		err := nvmlError(fmt.Sprintf("get GPU %d", i), ret)
		var g gpuRecord
		if err == nil {
			g, err = n.readGPU(ctx, i, h)
		}
		switch {
		case errors.Is(err, nvml.ERROR_GPU_IS_LOST):
			prev, seen := n.known[i]
			if !seen {
				logger.Error(err, "GPU is lost and was never seen; it is not advertised until it is reset", "index", i)
				continue
			}
			logger.Error(err, "GPU is lost; reporting it unhealthy", "gpu", prev.dev.ID, "uuid", prev.dev.UUID)
			prev.lost = true
			g = prev
		case err != nil:
			return nil, nil, fmt.Errorf("discover: %w", err)
		default:
			answering = append(answering, g)
		}
		if g.migEnabled && len(g.migs) == 0 {
			// In MIG mode a GPU runs nothing itself, and it has no MIG
			// devices to give out either.
			if !n.noticed[g.dev.UUID] {
				logger.Info("GPU is in MIG mode without MIG devices; not advertised until MIG devices are created", "gpu", g.dev.ID, "uuid", g.dev.UUID)
				n.noticed[g.dev.UUID] = true
			}
			continue
		}
		delete(n.noticed, g.dev.UUID)
		known[i] = g
		gpus = append(gpus, g)
	}
	n.known = known
	return gpus, answering, nil
}

// readGPU reads one whole GPU and its MIG devices.
func (n *node) readGPU(ctx context.Context, i int, h nvml.Device) (gpuRecord, error) {
	logger := klog.FromContext(ctx)
	fail := func(op string, ret nvml.Return) (gpuRecord, error) {
		return gpuRecord{}, fmt.Errorf("GPU %d: %w", i, nvmlError(op, ret))
	}
	g := gpuRecord{handle: h, dev: types.Device{
		ID: fmt.Sprintf("gpu%d", i), Index: i, Vendor: Vendor, Health: types.Healthy, NUMANode: -1,
	}}
	d := &g.dev
	var ret nvml.Return
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return fail("get UUID", ret)
	}
	if d.Model, ret = h.GetName(); ret != nvml.SUCCESS {
		return fail("get name", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("get memory", ret)
	}
	d.MemoryMiB = int64(mem.Total >> 20)
	major, minor, ret := h.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return fail("get compute capability", ret)
	}
	d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("get PCI info", ret)
	}
	busID, err := normalizeBusID(cString(pci.BusId[:]))
	if err != nil {
		return gpuRecord{}, fmt.Errorf("GPU %d: %w", i, err)
	}
	d.PCIBusID = busID
	if d.ComputeUnits, err = smCount(h, major, minor); err != nil {
		return gpuRecord{}, fmt.Errorf("GPU %d: %w", i, err)
	}
	numa, ret := h.GetNumaNodeId()
	switch {
	case ret == nvml.SUCCESS:
		d.NUMANode = numa
	case unsupported(ret):
		var err error
		if d.NUMANode, err = n.sysfsNUMANode(busID); err != nil {
			logger.V(2).Info("NUMA node of GPU unknown", "gpu", d.ID, "err", err)
		}
	default:
		return fail("get NUMA node", ret)
	}

	mode, _, ret := h.GetMigMode()
	switch {
	case ret == nvml.SUCCESS:
		g.migEnabled = mode == nvml.DEVICE_MIG_ENABLE
	case unsupported(ret):
	default:
		return fail("get MIG mode", ret)
	}
	if g.migEnabled {
		if g.migs, err = readMIGDevices(g); err != nil {
			return gpuRecord{}, fmt.Errorf("GPU %d: %w", i, err)
		}
	}
	return g, nil
}

// readMIGDevices reads the MIG devices of a GPU in MIG mode.
func readMIGDevices(g gpuRecord) ([]migRecord, error) {
	maxCount, ret := g.handle.GetMaxMigDeviceCount()
	if err := nvmlError("count MIG devices", ret); err != nil {
		return nil, err
	}
	var migs []migRecord
	for j := 0; j < maxCount; j++ {
		h, ret := g.handle.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		fail := func(op string, ret nvml.Return) ([]migRecord, error) {
			return nil, fmt.Errorf("MIG device %d: %w", j, nvmlError(op, ret))
		}
		if ret != nvml.SUCCESS {
			return fail("get handle", ret)
		}
		m := migRecord{index: j, dev: types.Device{
			ID: fmt.Sprintf("%s-mig%d", g.dev.ID, j), Index: g.dev.Index, Vendor: Vendor,
			ComputeCapability: g.dev.ComputeCapability, NUMANode: g.dev.NUMANode, PCIBusID: g.dev.PCIBusID,
			Health: types.Healthy, Parent: g.dev.ID,
		}}
		if m.dev.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
			return fail("get UUID", ret)
		}
		// NVML names a MIG device by its GPU and profile, e.g.
		// "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
		if m.dev.Model, ret = h.GetName(); ret != nvml.SUCCESS {
			return fail("get name", ret)
		}
		mem, ret := h.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return fail("get memory", ret)
		}
		m.dev.MemoryMiB = int64(mem.Total >> 20)
		attrs, ret := h.GetAttributes()
		if ret != nvml.SUCCESS {
			return fail("get attributes", ret)
		}
		m.dev.ComputeUnits = int32(attrs.MultiprocessorCount)
		gi, ret := h.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fail("get GPU instance", ret)
		}
		ci, ret := h.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return fail("get compute instance", ret)
		}
		m.gi, m.ci = uint32(gi), uint32(ci)
		migs = append(migs, m)
	}
	return migs, nil
}

// smCount returns a GPU's streaming multiprocessors. NVML reports them
// directly only for MIG devices (and, on some drivers, whole GPUs); else
// they follow from the CUDA core count and the cores per SM of the
// architecture. 0 means unknown.
func smCount(h nvml.Device, major, minor int) (int32, error) {
	attrs, ret := h.GetAttributes()
	switch {
	case ret == nvml.SUCCESS && attrs.MultiprocessorCount > 0:
		return int32(attrs.MultiprocessorCount), nil
	case ret != nvml.SUCCESS && !unsupported(ret):
		return 0, nvmlError("get attributes", ret)
	}
	cores, ret := h.GetNumGpuCores()
	switch {
	case unsupported(ret):
		return 0, nil
	case ret != nvml.SUCCESS:
		return 0, nvmlError("get CUDA core count", ret)
	}
	perSM := coresPerSM(major, minor)
	if perSM == 0 || cores%perSM != 0 {
		return 0, nil
	}
	return int32(cores / perSM), nil
}

// coresPerSM is the CUDA cores of one SM by compute capability, as the CUDA
// samples' _ConvertSMVer2Cores has it; 0 for an unknown architecture.
func coresPerSM(major, minor int) int {
	switch {
	case major == 3:
		return 192
	case major == 5:
		return 128
	case major == 6 && minor == 0:
		return 64
	case major == 6:
		return 128
	case major == 7:
		return 64
	case major == 8 && minor == 0:
		return 64
	case major == 8:
		return 128
	case major >= 9 && major <= 12:
		return 128
	}
	return 0
}

// sysfsNUMANode reads a PCI device's NUMA node from sysfs; -1 when the
// machine has none or it cannot be read.
func (n *node) sysfsNUMANode(busID string) (int, error) {
	b, err := os.ReadFile(filepath.Join(n.sysfs, "bus", "pci", "devices", busID, "numa_node"))
	if err != nil {
		return -1, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < -1 {
		return -1, fmt.Errorf("malformed numa_node of %s: %q", busID, b)
	}
	return v, nil
}
