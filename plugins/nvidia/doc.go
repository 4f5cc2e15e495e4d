// Package nvidia is the device module of NVIDIA GPUs, on NVML through
// go-nvml.
//
// The node side (NodePlugin) discovers every GPU: index, UUID, product name,
// memory, SM count, compute capability, PCI bus ID and NUMA node; in MIG
// mode, its MIG devices as devices of their own, with their own UUIDs and
// memory; and the path between every pair of GPUs: the number of NVLinks
// between them, an NVSwitch fabric (all-to-all), or the PCIe path through
// their common ancestor. A watcher on NVML's event set marks the GPUs (or
// MIG devices) hit by a critical XID error unhealthy. ContainerEdits gives a
// container its devices as CDI device names from nvidia-ctk's generated
// spec or as NVIDIA_VISIBLE_DEVICES, and shared slices MPS limits on a node
// configured for MPS.
//
// The scheduler side rates links with package gpulink and refuses to share
// MIG devices. It never touches NVML, so it works on hosts without GPUs.
//
// NVML is an injected nvml.Interface (NewModuleWithNVML; tests use the
// mock machines of package nvmltest). NewModule, which the .so exports
// (./plugin), opens the node's libnvidia-ml through package nvmllib so that
// the .so loads on machines without the driver; NodePlugin then fails with
// an error wrapping ErrNoNVML that says what is missing.
//
// Options (--plugin-option nvidia.KEY=VALUE) are listed in README.md and
// as the Option* constants. The node plugin is safe for concurrent use.
//
// Logging: errors (lost GPUs, unhealthy devices, NVSwitch peer-to-peer
// unavailable) at level 0; configuration at V(2); each discovered inventory
// at V(5).
package nvidia
