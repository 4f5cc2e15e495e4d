// Package intel finds Intel GPUs from sysfs (/sys/class/drm/cardN): the
// GPUs bound to the i915 or xe driver, each with its PCI address, NUMA
// node, render node, tiles (i915's gt/gtN, xe's tileN) and local memory
// (the backport i915's lmem_total_bytes, or the model's nominal memory
// where the driver publishes none), judged unhealthy from what the kernel
// publishes (xe's survivability_mode and gpu_health, the backport i915's
// device_memory_health). A GPU bound to i915 is asked for as
// gpu.intel.com/i915, one bound to xe as gpu.intel.com/xe, as Intel's
// GPU device plugin names them; a container gets exactly its GPUs'
// /dev/dri/cardN and renderDN nodes, and the shim strips the others
// (types.GuardedNodesPlugin).
//
// Discovery reads a tree under a root directory (the module option
// intel.root), so that tests run on the trees recorded in testdata (see
// testdata/README.md for where each value comes from), within bounds of
// cards, entries and bytes; a malformed file is an error that names it.
//
// Intel's own sysfs discovery (intel-resource-drivers-for-kubernetes,
// pkg/gpu/discovery) is importable but not used: its package pulls in the
// kubelet plugin and CDI libraries through its helpers, it tracks
// Kubernetes modules ahead of this project's, and it reads local memory
// through DRM ioctls on the card node, which needs a privileged process;
// what this package needs of it is a few dozen lines of uevent reading.
//
// Not yet: tiles as units a container may get alone (a tile's share of a
// GPU is a slice for now), Xe Link between GPUs (sysfs does not show it),
// CDI edits from Intel's CDI specs.
package intel
