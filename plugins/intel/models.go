package intel

// ResourcePrefix starts the device resources of Intel GPUs: a GPU bound
// to i915 is asked for as gpu.intel.com/i915, one bound to xe as
// gpu.intel.com/xe, as Intel's GPU device plugin names them.
const ResourcePrefix = "gpu.intel.com/"

// model is what the PCI device ID tells of a GPU: its name, its nominal
// local memory (used where the driver publishes none in sysfs: xe, and
// mainline i915) and its Xe cores.
type model struct {
	name      string
	memoryMiB int64
	xeCores   int32
}

// models by PCI device ID. IDs: the kernel's include/drm/intel/pciids.h
// (INTEL_PVC_IDS, INTEL_ATS_M150_IDS, INTEL_DG2_G10_IDS, INTEL_BMG_IDS)
// and the names of intel-resource-drivers-for-kubernetes'
// pkg/gpu/device/models.go; memory and Xe cores: Intel's product
// specifications (ark.intel.com), in GiB as Intel states them in GB.
var models = map[string]model{
	"0x0bd5": {"Intel Data Center GPU Max 1550", 128 << 10, 128},
	"0x0bd9": {"Intel Data Center GPU Max 1100", 48 << 10, 56},
	"0x0bda": {"Intel Data Center GPU Max 1100", 48 << 10, 56},
	"0x0bdb": {"Intel Data Center GPU Max 1100", 48 << 10, 56},
	"0x56c0": {"Intel Data Center GPU Flex 170", 16 << 10, 32},
	// The A770 comes with 8 or 16 GB under one ID: memory unknown.
	"0x56a0": {"Intel Arc A770 Graphics", 0, 32},
	"0xe20b": {"Intel Arc B580 Graphics", 12 << 10, 20},
}

// modelOf is the model of PCI device ID id ("0x0bd5"); an unknown one is
// named by its ID, with memory and cores unknown (0).
func modelOf(id string) model {
	if m, ok := models[id]; ok {
		return m
	}
	return model{name: "Intel GPU " + id}
}
