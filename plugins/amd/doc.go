// Package amd finds AMD GPUs from the amdkfd driver's topology in sysfs
// (/sys/class/kfd/kfd/topology): each GPU (or GPU partition) with its
// memory, compute units, PCI address, NUMA node and render node, and the
// XGMI links between GPUs of one hive, hops and bandwidth as the kernel
// reports them, for the engine to place multi-GPU pods on well-connected
// sets as it does with NVLink.
//
// Discovery reads a tree under a root directory, so that tests run on the
// trees recorded in testdata (see testdata/README.md for where each value
// comes from). It reads at most a bounded number of nodes, links and bytes
// per file, and a malformed file is an error that names it.
//
// GPUs outside the reader's device cgroup, which amdkfd answers with
// EPERM, are left out and counted (Topology.Hidden). Topology.Edits gives a
// container /dev/kfd and exactly its GPUs' render nodes; Scheduler rates
// the links for the engine. NewModule is the device module (node side
// with the option amd.root, scheduler side); it is not built into a .so
// yet: that waits for the resource amd.com/gpu, so that no nvidia.com/gpu
// request is served by an AMD GPU.
package amd
